"""DeepGEMM (optional, built from its repository) at the three families' projection shapes:
staging and building it (stage.sh, build.sh, env.sh) and the benchmark (`shapes.py`). README.md
says how the lead runs them on the GPU machine."""
