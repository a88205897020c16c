#!/usr/bin/env bash
# coc-test-timeout: 300
# coc as a library: `cmake --install` of this build into a temporary prefix, then tests/install/consumer.cpp (a
# program outside the tree) built against it twice, with find_package(coc CONFIG) → coc::coc and with
# pkg-config coc, and run on 2 ranks: one matmul_all_reduce, checked against plain loops.
source "$(dirname "$0")/common.bash"
BUILD=$(cd "$(dirname "$COC")/.." && pwd)
PREFIX="$TMP/prefix"
cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" 2>&1
check "cmake --install $BUILD --prefix DIR (exit $?)" test -f "$PREFIX/lib/libcoc.a"
check "the headers, the CMake package and coc.pc are installed" test -f "$PREFIX/include/coc/overlap/coc_ops.h" -a \
  -f "$PREFIX/lib/cmake/coc/cocConfig.cmake" -a -f "$PREFIX/lib/cmake/coc/cocConfigVersion.cmake" -a \
  -f "$PREFIX/lib/pkgconfig/coc.pc" -a -x "$PREFIX/bin/coc"
check "coc.pc names the install prefix" grep -qx "prefix=$PREFIX" "$PREFIX/lib/pkgconfig/coc.pc"

# The MPI compiler of this build (MPICH's preset builds with mpicxx.mpich), so the consumer matches the launcher.
mpicxx=$(sed -n 's/^MPI_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
cmake -S "$ROOT/tests/install" -B "$TMP/consumer" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
  ${mpicxx:+-DMPI_CXX_COMPILER="$mpicxx"} >"$TMP/configure.log" 2>&1 &&
  cmake --build "$TMP/consumer" >"$TMP/build.log" 2>&1
rc=$?
check "the consumer builds with find_package(coc CONFIG) and coc::coc (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -n 15 "$TMP/configure.log" "$TMP/build.log"
timeout 60 "$LAUNCH" -n 2 -- "$TMP/consumer/coc_consumer" >"$TMP/run.out" 2>&1
rc=$?
check "the CMake consumer runs one CoC op on 2 ranks (exit $rc)" test $rc -eq 0 -a "$(grep -c ': ok$' "$TMP/run.out")" -eq 2
sed 's/^/    /' "$TMP/run.out" | head -2

# pkg-config: the compiler alone, every flag from coc.pc (MPI's through its Requires).
flags=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --cflags --libs --static coc 2>"$TMP/pc.err")
check "pkg-config --cflags --libs coc (exit $?)" test -n "$flags"
# shellcheck disable=SC2086  # flags is a list
c++ -std=c++20 -O1 "$ROOT/tests/install/consumer.cpp" -o "$TMP/pc_consumer" $flags >"$TMP/pc_build.log" 2>&1
rc=$?
check "the consumer builds with c++ and pkg-config coc (exit $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -n 15 "$TMP/pc_build.log"
timeout 60 "$LAUNCH" -n 2 -- "$TMP/pc_consumer" >"$TMP/pc_run.out" 2>&1
check "the pkg-config consumer runs on 2 ranks" test "$(grep -c ': ok$' "$TMP/pc_run.out")" -eq 2
finish
