b=.deps/bin; tar -C .deps -xJf .deps/bin.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64 XDG_CACHE_HOME=$PWD/.cache; py=/opt/torch/.venv/bin/python3
timeout 300 $py bench/torch_twin.py examples/gpt2_124m.json --seam $b/seam --device cuda --steps 50 > $OUT/twin.log 2>&1; echo twin rc=$?; tail -30 $OUT/twin.log
