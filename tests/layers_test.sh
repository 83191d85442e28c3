#!/usr/bin/env bash
# The layers of src/ (docs/architecture.md): each may include only its own headers and those of
# the layers before it in this list, and only exec (which implements Request) and the layers
# after it the public Communicator API. Fails naming every include that breaks the order (the
# build refuses includes of higher layers too, src/CMakeLists.txt; this check also names them and
# covers the Communicator API). `--self-test SRC_DIR` checks that a copy of the tree with one wrong
# include fails.
set -euo pipefail
if [[ ${1:-} == --self-test ]]; then
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' EXIT
  cp -r "${2:?usage: layers_test.sh --self-test SRC_DIR}" "$copy/src"
  echo '#include "comm/comm_impl.hpp"' >>"$copy/src/transport/transport.cpp"
  if bash "$0" "$copy/src" 2>"$copy/err"; then
    echo "self-test: a transport file including comm/comm_impl.hpp passed the check" >&2
    exit 1
  fi
  grep -q 'layer transport: transport/transport.cpp includes "comm/comm_impl.hpp"' "$copy/err"
  echo "self-test: the wrong include was named"
  exit 0
fi
src=${1:?usage: layers_test.sh SRC_DIR}
layers=(core reduce bootstrap transport schedule exec comm device offload gpu sparse compress engine sim)
communicator_api='tutti/(tutti|mpi|engine|torch|sparse|compress)'
status=0
for ((i = 0; i < ${#layers[@]}; i++)); do
  layer=${layers[i]}
  allowed="${layers[*]:0:i+1}"
  allowed="tutti|${allowed// /|}"
  while IFS= read -r line; do
    file=${line%%:*}
    header=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${line#*:}")
    prefix=${header%%/*}
    if ! [[ $prefix =~ ^($allowed)$ ]] || { ((i < 5)) && [[ $header =~ ^$communicator_api\.hpp$ ]]; }; then
      echo "layer $layer: ${file#"$src"/} includes \"$header\"" >&2
      status=1
    fi
  done < <(grep -rHE '^#include "[^"]+/' "$src/$layer" || true)
done
((status == 0)) && echo "layers: every include follows the order ${layers[*]}"
exit $status
