# cmake -DIN=src.proto -DOUT=dst.proto -P optional_to_oneof.cmake
#
# protoc-c 1.4 refuses proto3 `optional` fields. On the wire a proto3
# optional scalar is exactly a one-member oneof, so the C code is generated
# from a copy where every `optional T x = N;` reads `oneof opt_x { T x = N; }`:
# the C struct then has `opt_x_case` (0 = unset) next to `x`. Reflection
# serves the descriptors of the original file, so clients see `optional`.
file(READ "${IN}" text)
string(REGEX REPLACE
  "([\n][ \t]*)optional[ \t]+([A-Za-z0-9_.]+)[ \t]+([A-Za-z0-9_]+)[ \t]*=[ \t]*([0-9]+)[ \t]*;"
  "\\1oneof opt_\\3 { \\2 \\3 = \\4; }" text "${text}")
file(WRITE "${OUT}.tmp" "${text}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
