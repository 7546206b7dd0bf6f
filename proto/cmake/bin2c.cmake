# cmake -DIN=file.bin -DOUT=file.c -DNAME=symbol -P bin2c.cmake
#
# Turns a binary file into a C source defining
#   const unsigned char NAME[];  const size_t NAME_len;
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
# Break the one long line every 16 bytes (80 hex characters).
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){16})" "\\1\n    " body "${body}")
file(WRITE "${OUT}.tmp"
  "/* Generated from ${IN} by proto/cmake/bin2c.cmake. */\n"
  "#include <stddef.h>\n"
  "const unsigned char ${NAME}[] = {\n    ${body}\n    0x00};\n"
  "const size_t ${NAME}_len = ${n};\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
