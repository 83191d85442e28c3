# The layers of src/ and what each may include (docs/architecture.md): the one table that the build
# (src/CMakeLists.txt) and the ctest layers (tests/architecture/layers_test.sh) both read.
#
# TUTTI_LAYERS: the layers, lowest first. TUTTI_LAYER_DEPS_<layer>: the layers whose headers the
# layer's files include, besides its own; each is a layer before it in TUTTI_LAYERS. The build links
# tutti_<layer> to these and to no other layer, so a layer's files see the headers of its declared
# layers and, through their public links, of the layers those declare. The ctest layers checks
# that every include of a layer's files names a declared layer and that every declared layer is
# included. Keep each set() on one line: the test reads them with sed.
set(TUTTI_LAYERS core reduce bootstrap transport schedule exec comm device offload gpu sparse compress engine sim)

set(TUTTI_LAYER_DEPS_core)
set(TUTTI_LAYER_DEPS_reduce core)
set(TUTTI_LAYER_DEPS_bootstrap core)
set(TUTTI_LAYER_DEPS_transport core reduce bootstrap)
set(TUTTI_LAYER_DEPS_schedule core)
set(TUTTI_LAYER_DEPS_exec core reduce transport schedule)
set(TUTTI_LAYER_DEPS_comm core reduce bootstrap transport schedule exec)
set(TUTTI_LAYER_DEPS_device core reduce)
set(TUTTI_LAYER_DEPS_offload device)
set(TUTTI_LAYER_DEPS_gpu core comm device)
set(TUTTI_LAYER_DEPS_sparse reduce schedule comm)
set(TUTTI_LAYER_DEPS_compress reduce sparse)
set(TUTTI_LAYER_DEPS_engine core comm device gpu)
set(TUTTI_LAYER_DEPS_sim schedule comm engine)
