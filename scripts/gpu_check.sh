#!/usr/bin/env bash
# The GPU check (deploy/README.md, "GPU check"): on a Linux machine with an
# NVIDIA GPU, CUDA, CMake, ninja and PyTorch (whose LibTorch it builds
# against), without network, it
#   1. unpacks the bundle scripts/gpu_bundle.sh made (gRPC, Protobuf, Abseil,
#      spdlog, prometheus-cpp, hiredis, PCRE2, utf8proc, GoogleTest, ...) into
#      build-gpu/prefix;
#   2. configures and builds kvl-server, kvl, the benchmarks and the device's
#      tests against it and that LibTorch (-DTorch_DIR) in build-gpu/build;
#   3. runs the tests on the device (KVL_TEST_DEVICE: tests/router/device_test.cc
#      against the CPU; the model, KV-cache, translator and scheduler tests as
#      built against this LibTorch);
#   4. times, on the device, the switch at Qwen3-0.6B -> 1.7B and 1.7B -> 0.6B
#      shapes (random weights, bench/shapes/) against a re-prefill at each
#      context, and decode at 1, 8 and 32 sessions, with the device's limits;
#   5. writes everything to one results file, OUT/gpu_check.txt.
#
#   scripts/gpu_check.sh                     # cuda, contexts 1024..32768
#   scripts/gpu_check.sh --device cuda:1 --contexts 1024,4096
#   scripts/gpu_check.sh --dry-run           # on this CPU: all of the above with the
#                                            # house shapes, 64-256 tokens (minutes)
#   scripts/gpu_check.sh --ci                # the CI's part: bundle, configure, build
#                                            # the generated gRPC code against the prefix
# Options: --bundle FILE (default build-gpu/bundle.tar.xz; made here when
# missing and Debian's archive is reachable), --torch-dir DIR (default:
# PyTorch's, from python3), --out DIR (default $OUT if set, else build-gpu),
# --contexts T,T,... --model-dtype float32|bfloat16 (default bfloat16 on a
# GPU), --jobs N.
# Exits non-zero when a step fails; the results file says which.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)

device=cuda mode=gpu bundle=build-gpu/bundle.tar.xz torch_dir="" out_dir=${OUT:-build-gpu}
contexts="" model_dtype="" jobs=$(nproc)
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) device=$2; shift 2 ;;
    --dry-run) mode=dry; device=cpu; shift ;;
    --ci) mode=ci; device=cpu; shift ;;
    --bundle) bundle=$2; shift 2 ;;
    --torch-dir) torch_dir=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --model-dtype) model_dtype=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
if [[ $mode == gpu ]]; then
  contexts=${contexts:-1024,4096,8192,16384,32768}
  model_dtype=${model_dtype:-bfloat16}
else
  contexts=${contexts:-64,256}
  model_dtype=${model_dtype:-float32}
fi
mkdir -p "$out_dir"
results=$out_dir/gpu_check.txt
# The steps' logs stay in the tree (a failed step's tail goes into the results
# file): $OUT then holds one file.
log_dir=$src/build-gpu/logs
mkdir -p "$log_dir"
: > "$results"
say() { echo "$*" | tee -a "$results"; }
# step NAME CMD...: runs CMD with its output in log_dir/NAME.log, records the
# result and the seconds; a failure ends the check with the log's tail.
step() {
  local name=$1; shift
  local start=$SECONDS rc=0
  echo "=== $name: $*"
  "$@" > "$log_dir/$name.log" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then
    say "step $name: FAILED (exit $rc) after $((SECONDS - start)) s; the end of its log:"
    tail -40 "$log_dir/$name.log" | tee -a "$results"
    exit 1
  fi
  say "step $name: ok, $((SECONDS - start)) s"
}

say "kvlingo GPU check, mode $mode, device $device, $(date -u +%FT%TZ)"
say "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
say "host $(uname -srm); $(nproc) cores"
if command -v nvidia-smi > /dev/null; then
  say "gpu $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
fi

# 1. The bundle, unpacked into the prefix.
if [[ ! -f $bundle ]]; then
  step bundle scripts/gpu_bundle.sh "$bundle"
fi
prefix=$src/build-gpu/prefix
rm -rf "$prefix"
mkdir -p "$prefix"
step unpack tar -C "$prefix" -xJf "$bundle"
say "bundle $bundle: $(du -h "$bundle" | cut -f1), $(wc -l < "$prefix/BUNDLE_DEBS") packages"
arch_lib=$prefix/usr/lib/x86_64-linux-gnu
export PATH=$prefix/usr/bin:$PATH
export LD_LIBRARY_PATH=$arch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# pkg-config reads the prefix's .pc files only, their /usr paths moved into it.
export PKG_CONFIG_LIBDIR=$arch_lib/pkgconfig:$prefix/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$prefix
# pkgconf from the bundle, by the name CMake looks for.
[[ -e $prefix/usr/bin/pkg-config ]] || ln -s pkgconf "$prefix/usr/bin/pkg-config"

# 2. Configure and build against the prefix and LibTorch.
if [[ -z $torch_dir ]]; then
  if [[ $mode == gpu ]]; then
    torch_dir=$(python3 -c 'import os, torch; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')
  else
    torch_dir=$(dirname "$(find /usr/lib /usr/share -name TorchConfig.cmake -print -quit)")
  fi
fi
say "LibTorch $torch_dir"
build=$src/build-gpu/build
cmake_args=(-G Ninja -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release
            -DTorch_DIR="$torch_dir" -DCMAKE_PREFIX_PATH="$prefix/usr"
            -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
            -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc"
            -DKVL_TEST_TOOLS=OFF -DKVL_CCACHE=OFF -DKVL_BUILD_BENCH=ON
            # The bundle's multiarch headers (OpenSSL's configuration), which
            # the compiler would otherwise take from this machine's /usr.
            -DCMAKE_CXX_FLAGS="-isystem $prefix/usr/include/x86_64-linux-gnu"
            -DCMAKE_C_FLAGS="-isystem $prefix/usr/include/x86_64-linux-gnu")
[[ $device == cuda* ]] && cmake_args+=(-DKVL_REQUIRE_CUDA=ON)
# Every package found afresh; --ci builds from nothing, so that the headers
# checked below are its build's alone.
rm -f "$build/CMakeCache.txt"
[[ $mode == ci ]] && rm -rf "$build"
step configure cmake "${cmake_args[@]}"
# Every package, header directory, library and program the configure found
# must come from the prefix (or the source tree), except LibTorch's own and the
# toolchain's (Debian's LibTorch brings glog, gflags and libunwind): a GPU
# machine has nothing else of this machine's /usr.
found=$(grep -E '^[A-Za-z0-9_-]+(_DIR:PATH|_INCLUDE_DIR:PATH|_LIBRARY(_RELEASE)?:FILEPATH|_EXECUTABLE:FILEPATH|_PROGRAM:FILEPATH|_PLUGIN:FILEPATH)=/' \
          "$build/CMakeCache.txt" |
        grep -v -E '^(CMAKE_|Torch|TORCH_|Caffe2|CUDA|CUDAToolkit|CUDNN|CUPTI|kineto|MKL|NVTX|OpenMP|Python|c10|gflags|glog|Unwind|KVL_CCACHE|PKG_CONFIG)' |
        grep -v -e "=$prefix/" -e "=$src/" || true)
if [[ -n $found ]]; then
  say "configure: found outside the bundle:"
  say "$found"
  exit 1
fi
say "configure: every package from the bundle or LibTorch"

if [[ $mode == ci ]]; then
  targets=(kvl_proto)
else
  tests=(router_device_test translator_translator_test model_kv_cache_test model_decoder_test
         model_scheduler_test model_engine_test)
  targets=(kvl-server kvl translator_bench batch_step_bench "${tests[@]}")
fi
step build cmake --build "$build" -j "$jobs" --target "${targets[@]}"
if [[ $mode != gpu ]]; then
  # Every header the build read came from the prefix, the source or build
  # tree, LibTorch (Debian's here, with its glog and gflags) or the C/C++
  # toolchain's packages: what a GPU machine has. ninja keeps what each
  # object read in its log of dependencies; dpkg names each file's package
  # ("pkg: /path", or "pkg1, pkg2: /path").
  read_files=$(ninja -C "$build" -t deps | grep '^    /' | sed 's/^ *//' | sort -u)
  [[ $(wc -l <<<"$read_files") -gt 100 ]] || { say "build: ninja -t deps lists no headers"; exit 1; }
  stray=$(grep -v -e "^$prefix/" -e "^$src/" -e '^/usr/include/c++/' -e '^/usr/lib/gcc/' \
            <<<"$read_files" || true)
  allowed='libc6-dev|linux-libc-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libcrypt-dev'
  allowed+='|libtorch-dev|libgflags-dev|libgoogle-glog-dev'
  bad=$( (xargs -r realpath <<<"$stray" | xargs -r dpkg -S 2>&1 || true) |
         grep -v -E "^($allowed)(:amd64)?: " || true)
  if [[ -n $bad ]]; then
    say "build: headers from outside the bundle, LibTorch and the toolchain:"
    say "$bad"
    exit 1
  fi
  say "build: $(wc -l <<<"$read_files") headers and sources read, all from the bundle, LibTorch, the toolchain or the tree"
fi
if [[ $mode == ci ]]; then
  say "gpu_check --ci: passed (the tests and benchmarks run with --dry-run or on a GPU)"
  exit 0
fi

# 3. The tests, on the device.
export KVL_TEST_DEVICE=$device
for t in "${tests[@]}"; do
  bin=$(find "$build/tests" -type f -name "$t" -perm -u+x | head -1)
  step "test_$t" "$bin"
done
say "tests: ${tests[*]} passed with KVL_TEST_DEVICE=$device"

# 4. The benchmarks.
kvl_bin=$build/tools/kvl
bench=$build/bench
work=$src/build-gpu/work
mkdir -p "$work/pair"
if [[ $mode == gpu ]]; then
  small=qwen3-0.6b large=qwen3-1.7b shapes=bench/shapes
else
  small=kvl-small large=kvl-large shapes=models/configs
fi
for m in "$small" "$large"; do
  [[ -f $work/$m/model.safetensors ]] ||
    step "init_$m" "$kvl_bin" init-model --config "$shapes/$m.json" --out "$work/$m" --seed 1
done
cp "$shapes/$small.json" "$work/pair/kvl-small.json"
cp "$shapes/$large.json" "$work/pair/kvl-large.json"
anchor_rank=64
step switch "$bench/translator_bench" --configs "$work/pair" --contexts "$contexts" --switch-only \
  --band 2 --anchor-window 8 --anchor-rank "$anchor_rank" --threads "$(nproc)" \
  --device "$device" --model-dtype "$model_dtype" --out "$log_dir/switch.txt"
say ""
cat "$log_dir/switch.txt" >> "$results"
for m in "$small" "$large"; do
  step "decode_$m" "$bench/batch_step_bench" --model "$work/$m" --compare matvec --rows 1,8,32 \
    --history 256 --steps 10 --limits --device "$device" --dtype "$model_dtype" \
    --out "$log_dir/decode_$m.txt"
  say ""
  cat "$log_dir/decode_$m.txt" >> "$results"
done
say ""
say "gpu_check: passed; results in $results"
