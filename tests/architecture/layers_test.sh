#!/usr/bin/env bash
# The layers of src/ (docs/architecture.md): each may include only its own headers and those of
# the layers it declares in src/layers.cmake (TUTTI_LAYER_DEPS_<layer>, the table the build links
# by), each declared layer is one before it in TUTTI_LAYERS and is included by some file of the
# layer, and only exec (which implements Request) and the layers after it include the public
# Communicator API. Fails naming every include and declaration that breaks a rule (the build
# refuses includes of layers a layer cannot see too, src/CMakeLists.txt; this check also names
# them, including those of layers seen only through a declared layer's links, and covers the
# Communicator API). `--self-test SRC_DIR` checks that copies of the tree with one wrong include
# fail: a transport file including a comm header (a layer after it) and a schedule file including
# a transport header (a layer before it that schedule does not declare).
set -euo pipefail
if [[ ${1:-} == --self-test ]]; then
  src=${2:?usage: layers_test.sh --self-test SRC_DIR}
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' EXIT
  # wrong_include FILE HEADER: a copy of the tree with FILE including HEADER must fail, naming it.
  wrong_include() {
    rm -rf "$copy/src"
    cp -r "$src" "$copy/src"
    echo "#include \"$2\"" >>"$copy/src/$1"
    if bash "$0" "$copy/src" 2>"$copy/err"; then
      echo "self-test: $1 including $2 passed the check" >&2
      exit 1
    fi
    if ! grep -qF "layer ${1%%/*}: $1 includes \"$2\"" "$copy/err"; then
      echo "self-test: $1 including $2 failed without naming it:" >&2
      cat "$copy/err" >&2
      exit 1
    fi
  }
  wrong_include transport/transport.cpp comm/comm_impl.hpp
  wrong_include schedule/schedule.cpp transport/transport.hpp
  echo "self-test: the wrong includes were named"
  exit 0
fi
src=${1:?usage: layers_test.sh SRC_DIR}
table=$src/layers.cmake
# The value of `set(NAME ...)` on one line of the table; fails when NAME is not set exactly once.
declared() {
  local lines
  lines=$(grep -E "^set\($1( [^)]*)?\)" "$table" || true)
  if [[ -z $lines || $lines == *$'\n'* ]]; then
    echo "${table#"$src"/}: $1 is not set on exactly one line" >&2
    return 1
  fi
  local -a words
  read -ra words <<<"${lines#"set($1"}"
  words[-1]=${words[-1]%)}
  echo "${words[*]}"
}
read -ra layers <<<"$(declared TUTTI_LAYERS)"
communicator_api='tutti/(tutti|mpi|engine|torch|sparse|compress)'
status=0
api=no
for ((i = 0; i < ${#layers[@]}; i++)); do
  layer=${layers[i]}
  [[ $layer == exec ]] && api=yes
  deps=$(declared "TUTTI_LAYER_DEPS_$layer") || {
    status=1
    continue
  }
  before=" ${layers[*]:0:i} "
  for dep in $deps; do
    if [[ $before != *" $dep "* ]]; then
      echo "layer $layer: declares $dep, which is not a layer before it" >&2
      status=1
    elif ! grep -rqE "^\s*#\s*include \"$dep/" "$src/$layer"; then
      echo "layer $layer: declares $dep, whose headers none of its files include" >&2
      status=1
    fi
  done
  allowed="tutti|$layer${deps:+|${deps// /|}}"
  while IFS= read -r line; do
    file=${line%%:*}
    header=$(sed -E 's/.*#\s*include "([^"]+)".*/\1/' <<<"${line#*:}")
    prefix=${header%%/*}
    if ! [[ $prefix =~ ^($allowed)$ ]] || { [[ $api == no ]] && [[ $header =~ ^$communicator_api\.hpp$ ]]; }; then
      echo "layer $layer: ${file#"$src"/} includes \"$header\"" >&2
      status=1
    fi
  done < <(grep -rHE '^\s*#\s*include "[^"]+/' "$src/$layer" || true)
done
((status == 0)) && echo "layers: every include names a declared layer (src/layers.cmake)"
exit $status
