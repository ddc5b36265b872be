"""Build step of the pipeline: toolchain discovery, build.ninja, parallel compile, atomic publish."""
