"""Looking at results: compare two runs, the report, people's audits of a judge, the MLflow UI."""
