# Included at llama-cpp-python's project() call (`make setup-llm`: CMAKE_PROJECT_INCLUDE).
# Its CMakeLists forces llama.cpp's `common` library on (a cache entry, FORCE) for the
# multimodal library, which `make setup-llm` does not build (LLAVA_BUILD=OFF), and the Python
# package neither installs nor loads it: 57 of the 140 compile steps. A normal variable of the
# same name hides that cache entry (policy CMP0126, NEW under its cmake_minimum_required 3.21),
# so llama.cpp's `if (LLAMA_BUILD_COMMON)` skips it: 83 steps.
set(LLAMA_BUILD_COMMON OFF)
