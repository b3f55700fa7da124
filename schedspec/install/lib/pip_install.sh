# Sourced by scripts/install_torch_cpu.sh and scripts/install_vllm.sh; needs PY (the venv's
# python). `pip_install ARGS...` is `pip install ARGS...` minus the lines that are not news:
#   - "WARNING: Location 'file:...' is ignored": a file:// extra index that lacks the
#     package (this project's machines list such indexes in pip.conf);
#   - each extended regex in the array PIP_EXPECTED (install_vllm.sh: the dependencies it
#     leaves out on purpose, which pip's resolver reports while vLLM's METADATA still
#     lists them).
# pip's exit status is kept (run under `set -o pipefail`).
PIP_EXPECTED=()

pip_install() {
    local drop="^WARNING: Location 'file:"
    local pattern
    for pattern in "${PIP_EXPECTED[@]}"; do
        drop+="|$pattern"
    done
    "$PY" -m pip --disable-pip-version-check install "$@" 2>&1 | { grep -v -E "$drop" || true; }
}
