"""The environment the stages run in: containers and the image's stores, the team's services,
the stages' code dependencies."""
