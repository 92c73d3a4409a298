# Sourced by scripts/gpu_bench.sh and scripts/gpu_train.sh on the device machine (and in their
# --cpu checks): install the wheels carried in .whl/ (offline) and make `diffill` importable from
# this checkout without installing it. Needs PY (python), LOG (log file), ROOT (repo root) and
# SHIM (a scratch folder for the import shim); extends PYTHONPATH.
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/diffill_site .whl/*.whl >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/diffill_site${PYTHONPATH:+:$PYTHONPATH}
fi
rm -rf "$SHIM"; mkdir -p "$SHIM/diffill"
cp src_diffill/__init__.py "$SHIM/diffill/__init__.py"
for p in model kernels lsp_server; do ln -s "$ROOT/$p" "$SHIM/diffill/$p"; done
export PYTHONPATH=$SHIM${PYTHONPATH:+:$PYTHONPATH}
