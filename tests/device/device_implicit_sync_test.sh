#!/usr/bin/env bash
# The CUDA calls that may wait for other streams of the context (device/cuda/implicit_sync.hpp)
# are made in src/ only by that file's wrappers: fails naming every other use (a call, or the
# function's address or name; comments are not counted). `--self-test SRC_DIR` checks that a copy
# of the tree with one direct call, and one with a driver-API twin, fail, and that mentions in
# comments pass. Usage: device_implicit_sync_test.sh SRC_DIR | --self-test SRC_DIR
set -uo pipefail
# The runtime calls tools/cuda_waits measured to wait (or that CUDA documents as synchronising),
# their driver-API twins and the deprecated spellings.
forbidden='cudaFree|cudaFreeHost|cudaHostUnregister|cudaIpcCloseMemHandle|cudaMalloc|cudaHostAlloc|cudaMallocHost|cudaStreamSynchronize|cudaDeviceSynchronize|cudaThreadSynchronize|cudaDeviceReset|cuMemFree|cuMemFree_v2|cuMemFreeHost|cuMemHostUnregister|cuIpcCloseMemHandle|cuMemAlloc|cuMemAlloc_v2|cuMemHostAlloc|cuMemAllocHost|cuMemAllocHost_v2|cuCtxSynchronize|cuStreamSynchronize'
wrappers='device/cuda/implicit_sync.hpp device/cuda/implicit_sync.cpp'
# The emulated device includes no CUDA header (it builds without the toolkit), so it cannot call
# these; its strict mode names them in its messages ("cudaFree ... would hang").
names_only='device/emulated.cpp device/emulated_memory.cpp device/emulated_context.cpp'

if [[ ${1:-} == --self-test ]]; then
  src=${2:?usage: device_implicit_sync_test.sh --self-test SRC_DIR}
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' EXIT
  fail=0
  for planted in 'void f(void* p) { cudaFree(p); }' 'auto g = &cuMemFreeHost;'; do
    rm -rf "$copy/src" && cp -r "$src" "$copy/src"
    printf '%s\n' "$planted" >>"$copy/src/gpu/ipc.cpp"
    if bash "$0" "$copy/src" >"$copy/out" 2>&1; then
      echo "self-test: FAIL: '$planted' in gpu/ipc.cpp passed the check"
      fail=1
    elif ! grep -q '^gpu/ipc.cpp:[0-9]*: ' "$copy/out"; then
      echo "self-test: FAIL: '$planted' was not named"
      cat "$copy/out"
      fail=1
    fi
  done
  rm -rf "$copy/src" && cp -r "$src" "$copy/src"
  printf '%s\n' '// cudaFree(p) waits for every stream' '/* cudaDeviceSynchronize() too */' \
    'int x;  // cudaFreeHost(p)' 'cudaError_t e = cudaFreeAsync(nullptr, nullptr);' >>"$copy/src/gpu/ipc.cpp"
  if ! bash "$0" "$copy/src" >"$copy/out" 2>&1; then
    echo "self-test: FAIL: comments and cudaFreeAsync were taken for direct calls"
    cat "$copy/out"
    fail=1
  fi
  ((fail == 0)) && echo "self-test: direct calls named, comments and cudaFreeAsync passed"
  exit $fail
fi

src=${1:?usage: device_implicit_sync_test.sh SRC_DIR}
cd "$src" || exit 1
for w in $wrappers; do
  [[ -f $w ]] || { echo "FAIL: $w is missing"; exit 1; }
done
found=0
while IFS= read -r file; do
  [[ " $wrappers " == *" $file "* ]] && continue
  [[ " $names_only " == *" $file "* ]] && continue
  # Comments removed (// to the end of a line, /* */ within one line), then whole names only:
  # cudaFreeAsync is not cudaFree.
  hits=$(sed -e 's:/\*.*\*/::g' -e 's://.*$::' "$file" | grep -nwE "$forbidden") || continue
  while IFS= read -r hit; do
    echo "$file:${hit%%:*}: ${hit#*:}"
  done <<<"$hits"
  found=1
done < <(find . -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) | sed 's:^\./::' | sort)
if ((found)); then
  echo "FAIL: the calls above may wait for every stream of the context: make them through" \
    "device/cuda/implicit_sync.hpp (a wrapper that says so), never directly"
  exit 1
fi
echo "ok: no direct call in $src to a CUDA function that may wait for other streams outside $wrappers"
