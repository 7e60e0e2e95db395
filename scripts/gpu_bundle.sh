#!/usr/bin/env bash
# Packs what building kvlingo needs besides a compiler, CMake, ninja and
# LibTorch into one archive, for a GPU machine without network
# (scripts/gpu_check.sh unpacks it there; deploy/README.md, "GPU check").
# Runs on Debian 12 with its archive reachable: downloads the packages below
# (apt-get download, no install), unpacks them into a prefix, drops what a
# build never reads (documentation, the static libraries of the shared ones)
# and writes build-gpu/bundle.tar.xz (about 11 MB).
#   scripts/gpu_bundle.sh [OUT]          # default build-gpu/bundle.tar.xz
# Before packing it checks that the list is closed: every package the listed
# -dev packages depend on, recursively, is either listed or one the target
# already has (the C/C++ toolchain's) or never loaded by kvlingo's binaries
# (NOT_NEEDED below); a Debian update that adds a dependency fails here, not
# on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-gpu/bundle.tar.xz}

# The -dev packages kvlingo's build finds (cmake/Dependencies.cmake) and the
# tests' and benchmarks' (GoogleTest, Google Benchmark), with the runtime
# libraries they link and the tools the build runs (protoc, grpc_cpp_plugin,
# pkg-config).
BUNDLE=(
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler
  libabsl-dev libabsl20220623 libc-ares-dev libc-ares2 libre2-dev libre2-9
  libssl-dev libssl3 zlib1g-dev zlib1g
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libprometheus-cpp-push1.0 libcivetweb-dev libcivetweb1 civetweb libcurl4-openssl-dev libcurl4
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 nlohmann-json3-dev
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2 libhiredis-dev libhiredis0.14
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  pkgconf pkgconf-bin libpkgconf3
)
# Dependencies left out: the toolchain's (any machine that compiles C++ has
# them), GoogleTest's and Catch2's sources (the -dev packages ship built
# libraries), and what libcurl4 loads (prometheus-cpp's push library links
# curl; kvlingo links its pull side only, and CMake only needs curl's headers
# and library file to be there). civetweb's server program is bundled only
# because civetweb's CMake targets check that it exists.
NOT_NEEDED=(
  libc6 libc6-dev libc-dev-bin libgcc-s1 libstdc++6 gcc-12-base linux-libc-dev
  libcrypt-dev libcrypt1 libnsl-dev libnsl2 libtirpc-common libtirpc-dev libtirpc3
  rpcsvc-proto googletest catch2
  libcom-err2 libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3 libkrb5support0
  libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3 libgnutls30 libhogweed6
  libnettle8 libgmp10 libidn2-0 libunistring2 libp11-kit0 libffi8 libtasn1-6
  libnghttp2-14 libpsl5 librtmp1 libssh2-1 libzstd1
)

closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
            --no-replaces --no-enhances --no-pre-depends "${BUNDLE[@]}" 2>/dev/null |
          grep -v '^[ <]' | sort -u)
missing=()
for p in $closure; do
  [[ " ${BUNDLE[*]} ${NOT_NEEDED[*]} " == *" $p "* ]] || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "gpu_bundle: these dependencies are neither bundled nor known not to be needed:" \
       "${missing[*]} (scripts/gpu_bundle.sh, BUNDLE or NOT_NEEDED)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/prefix"
(cd "$work/debs" && apt-get download "${BUNDLE[@]}" >/dev/null 2>&1) || {
  echo "gpu_bundle: apt-get download failed (is Debian's archive reachable? apt-get update?)" >&2
  exit 1
}
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/prefix"; done
rm -rf "$work/prefix/usr/share/doc" "$work/prefix/usr/share/man" "$work/prefix/usr/share/lintian"
# The static archives of libraries that also come shared (CMake's imported
# targets name the shared ones); GoogleTest and Benchmark ship static only.
find "$work/prefix" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' ! -name 'libbenchmark*' \
  -delete
# What it was made from (package_version_arch.deb), for the results file.
(cd "$work/debs" && ls) > "$work/prefix/BUNDLE_DEBS"
mkdir -p "$(dirname "$out")"
tar -C "$work/prefix" -cf - . | xz -6 -T2 > "$out.tmp"
mv "$out.tmp" "$out"
echo "gpu_bundle: $out, $(du -h "$out" | cut -f1), ${#BUNDLE[@]} packages"
