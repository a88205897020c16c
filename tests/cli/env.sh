#!/usr/bin/env bash
# coc-test-timeout: 120
# `coc env` on 1 and 2 ranks (and oversubscribed): the MPI library and version, the thread level, the BLAS lines,
# one table row per rank, the JSON form, the verbose transport lines, and the deployment warnings (edge cases
# 14-19) where this machine can produce them.
source "$(dirname "$0")/common.bash"
cores=$(nproc)

for n in 1 2; do
  if timeout 60 "$LAUNCH" -n "$n" -- "$COC" env >"$TMP/env$n" 2>"$TMP/env$n.err"; then rc=0; else rc=$?; fi
  cat "$TMP/env$n"
  check "np=$n exits 0" test "$rc" -eq 0
  check "np=$n MPI library line" grep -Eq "^MPI library: +(Open MPI|MPICH|Intel|MVAPICH)" "$TMP/env$n"
  check "np=$n MPI vendor known" bash -c "grep -E '^MPI vendor:' '$TMP/env$n' | grep -vq unknown"
  check "np=$n MPI standard version" grep -Eq "^MPI standard: +[0-9]+\.[0-9]+" "$TMP/env$n"
  check "np=$n thread level" grep -Eq "^thread level: +MPI_THREAD_(SINGLE|FUNNELED|SERIALIZED|MULTIPLE)" "$TMP/env$n"
  check "np=$n world size" grep -Eq "^world size: +$n rank" "$TMP/env$n"
  check "np=$n BLAS config line" grep -Eq "^BLAS: +[A-Za-z]" "$TMP/env$n"
  check "np=$n BLAS threads line (launcher exports 1)" grep -Eq "^BLAS threads: +1 on rank 0 \(OPENBLAS_NUM_THREADS=1\)" "$TMP/env$n"
  check "np=$n launcher recognised" grep -Eq "^launcher: +scripts/launch" "$TMP/env$n"
  check "np=$n one table row per rank" test "$(grep -Ec '^ +[0-9]+ +[^ ]+ +[0-9]+ +[0-9,-]+ +[0-9]+ +[0-9]+$' "$TMP/env$n")" -eq "$n"
  check "np=$n only rank 0 prints" test "$(grep -c '^MPI library:' "$TMP/env$n")" -eq 1
done
if [ "$cores" -ge 2 ]; then
  # scripts/launch binds 2 ranks on >= 2 cores to distinct cores: no overlap, no oversubscription.
  check "np=2 no binding-overlap warning" bash -c "! grep -q 'binding-overlap' '$TMP/env2'"
  check "np=2 no oversubscribed warning" bash -c "! grep -q 'oversubscribed' '$TMP/env2'"
fi

# JSON: same facts, machine-readable (no python on a bare CI image: grep the keys).
timeout 60 "$LAUNCH" -n 2 -- "$COC" env --json >"$TMP/json" 2>/dev/null
check "json: starts with {" bash -c "head -c1 '$TMP/json' | grep -q '{'"
for key in '"library_version"' '"vendor"' '"thread_level": "MPI_THREAD_' '"world_size": 2' '"config"' \
           '"blas_threads": 1' '"affinity"' '"dev_shm_free_bytes"' '"warnings"'; do
  check "json has $key" grep -q "$key" "$TMP/json"
done

# --verbose: transport per pair of ranks (edge case 19 of docs/edge-cases.md) and the environment registry.
timeout 60 "$LAUNCH" -n 2 -- "$COC" env --verbose >"$TMP/verbose" 2>/dev/null
check "verbose: rank 0 <-> rank 1 over shared memory" grep -q "rank 0 <-> rank 1: shared memory" "$TMP/verbose"
check "verbose: registry lists COC_STDOUT_IS_TTY" grep -q "COC_STDOUT_IS_TTY=0" "$TMP/verbose"
check "verbose: registry lists OMPI_ALLOW_RUN_AS_ROOT" grep -q "OMPI_ALLOW_RUN_AS_ROOT" "$TMP/verbose"

# More ranks than cores: the oversubscription warning, with its fix.
if [ "$cores" -le 4 ]; then
  n=$((cores + 1))
  timeout 90 "$LAUNCH" -n "$n" -- "$COC" env >"$TMP/over" 2>/dev/null
  check "np=$n on $cores cores: oversubscribed warning" grep -q "\[oversubscribed\] host .* runs $n ranks on $cores cores" "$TMP/over"
  check "np=$n: the warning says how to fix it" grep -q "fix: run at most $cores ranks per host" "$TMP/over"
fi

# Two "hosts" on this machine (edge case 19): mpirun starts each rank through a launcher agent that gives it its own
# UTS namespace and hostname (the trick of scripts/cluster, without the network namespaces), so Open MPI sees two
# nodes and talks TCP between them. Needs unshare (root or user namespaces); skipped where it is not allowed.
# Open MPI only: the agent flag, the hostfile format and the btl_tcp_if_include read-back are Open MPI's.
if [ "${COC_MPI:-openmpi}" != openmpi ]; then
  echo "skip two-host checks: they drive Open MPI's plm_rsh_agent and btl settings (COC_MPI=$COC_MPI)"
elif unshare --uts true 2>/dev/null; then
  printf '#!/bin/sh\nhost=$1; shift\nexec unshare --uts sh -c "hostname $host; $*"\n' >"$TMP/agent"
  chmod +x "$TMP/agent"
  printf 'node1 slots=1\nnode2 slots=1\n' >"$TMP/hosts"
  COC_MPIRUN_EXTRA="--mca plm_rsh_agent $TMP/agent" timeout 60 "$LAUNCH" -n 2 --hostfile "$TMP/hosts" -- \
    "$COC" env --verbose >"$TMP/two_hosts" 2>"$TMP/two_hosts.err"
  check "two hosts: world seen as 2 hosts" grep -Eq "^world size: +2 rank\(s\) on 2 host\(s\)" "$TMP/two_hosts"
  check "two hosts: rank 0 <-> rank 1 over tcp, with its interface" \
    grep -Eq "rank 0 <-> rank 1: tcp .*interface: " "$TMP/two_hosts"
  check "two hosts: warns that no TCP interface was chosen" grep -q "\[tcp-interface\]" "$TMP/two_hosts"
  OMPI_MCA_btl_tcp_if_include=lo COC_MPIRUN_EXTRA="--mca plm_rsh_agent $TMP/agent" timeout 60 "$LAUNCH" -n 2 \
    --hostfile "$TMP/hosts" -- "$COC" env --json >"$TMP/two_hosts.json" 2>/dev/null
  check "two hosts: the interface setting is read back" grep -q '"tcp_interface": "include lo"' "$TMP/two_hosts.json"
else
  echo "skip two-host checks: unshare --uts is not permitted here"
fi

# Singleton (no launcher, no mpirun): works, and as root explains Open MPI's run-as-root refusal (edge case 14).
env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM -u COC_LAUNCHER timeout 60 "$COC" env \
  >"$TMP/single" 2>/dev/null
check "singleton exits 0" test $? -eq 0
if [ "${COC_MPI:-openmpi}" != openmpi ]; then
  check "not Open MPI: no run-as-root warning (only Open MPI refuses root)" bash -c "! grep -q 'run-as-root' '$TMP/single'"
elif [ "$(id -u)" = 0 ]; then
  check "singleton as root: run-as-root warning" grep -q "\[run-as-root\]" "$TMP/single"
  check "singleton as root: fix names the variables" grep -q "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" "$TMP/single"
else
  check "not root: no run-as-root warning" bash -c "! grep -q 'run-as-root' '$TMP/single'"
fi
# The other MPI library's launcher starts each rank as a singleton: a clear error, not two one-rank jobs.
other=mpich; [ "${COC_MPI:-openmpi}" = openmpi ] || other=openmpi
if [ "$other" = openmpi ] || command -v mpiexec.mpich >/dev/null; then
  timeout 60 "$LAUNCH" -n 2 --mpi "$other" -- "$COC" env >"$TMP/mismatch" 2>"$TMP/mismatch.err"
  check "launched by $other's launcher: exit 2" test $? -eq 2
  check "launched by $other's launcher: says why" grep -q "started as a world of 1 rank, but its launcher started 2" \
    "$TMP/mismatch.err"
fi
# BLAS threads x ranks > cores thrashes (edge case 16): the launcher's one-thread default is overridden here.
timeout 60 "$LAUNCH" -n 2 --bind none --blas-threads 4 -- "$COC" env >"$TMP/blas4" 2>/dev/null
check "4 BLAS threads per rank on 2 ranks: blas warning" grep -Eq "\[blas-(threads|single-core)\]" "$TMP/blas4"

# OpenBLAS's kernels (coc/kernels/blas_core.h). The BLAS kernels line is always there. COC_TEST_BLAS_CORE stands in
# for OpenBLAS's own detection falling back to Prescott (as 0.3.21 does on Emerald Rapids): coc must re-execute
# itself with OPENBLAS_CORETYPE set and report it; a weak OPENBLAS_CORETYPE chosen by hand is kept, with a warning.
# Both need a CPU with vector extensions above SSE3, which the JSON's cpu_level says.
check "BLAS kernels line" grep -Eq "^BLAS kernels: +[A-Za-z]" "$TMP/env2"
if grep -Eq '"cpu_level": [1-3]' "$TMP/json"; then
  # A core the user exported is kept by design, so the simulated fallback runs without one (CI machines export
  # OPENBLAS_CORETYPE themselves).
  env -u OPENBLAS_CORETYPE COC_TEST_BLAS_CORE=Prescott timeout 60 "$LAUNCH" -n 2 -- "$COC" env >"$TMP/fallback" 2>&1
  check "OpenBLAS fell back to Prescott: coc re-executes with a better core" \
    grep -Eq "^BLAS kernels: +[A-Za-z]+ \(set by coc: OpenBLAS picked Prescott" "$TMP/fallback"
  check "OpenBLAS fell back to Prescott: the fix leaves no warning" bash -c "! grep -q 'blas-core' '$TMP/fallback'"
  # The kernel warnings concern OpenBLAS's GEMMs: COC_GEMM_BACKEND=openblas makes them run there on any CPU.
  COC_GEMM_BACKEND=openblas OPENBLAS_CORETYPE=Prescott timeout 60 "$LAUNCH" -n 2 -- "$COC" env >"$TMP/forced" 2>&1
  check "OPENBLAS_CORETYPE=Prescott by hand: kept" grep -Eq "^BLAS kernels: +Prescott \(OPENBLAS_CORETYPE=Prescott\)" \
    "$TMP/forced"
  check "OPENBLAS_CORETYPE=Prescott by hand: blas-core warning with the fix" \
    grep -Eq "\[blas-core\].*Prescott" "$TMP/forced"
  check "OPENBLAS_CORETYPE=Prescott by hand: fix names a core" grep -Eq "fix: export OPENBLAS_CORETYPE=[A-Za-z]+" \
    "$TMP/forced"
  if grep -Eq '"cpu_level": 3' "$TMP/json"; then
    # AVX2 kernels chosen by hand on an AVX-512 CPU: kept (a vector family is never swapped), with a warning.
    COC_GEMM_BACKEND=openblas OPENBLAS_CORETYPE=Haswell timeout 60 "$LAUNCH" -n 2 -- "$COC" env >"$TMP/avx2" 2>&1
    check "OPENBLAS_CORETYPE=Haswell on AVX-512: kept" grep -Eq "^BLAS kernels: +Haswell \(OPENBLAS_CORETYPE=Haswell\)" \
      "$TMP/avx2"
    check "OPENBLAS_CORETYPE=Haswell on AVX-512: blas-core warning" \
      grep -Eq "\[blas-core\].*Haswell kernels \(OPENBLAS_CORETYPE=Haswell\) on a CPU that supports AVX-512" "$TMP/avx2"
    check "OPENBLAS_CORETYPE=Haswell on AVX-512: fix unsets it" grep -q "unset OPENBLAS_CORETYPE" "$TMP/avx2"
    # The default on AVX-512: oneDNN runs the fp32 GEMMs, so OpenBLAS's pinned kernels cost nothing and go unmentioned.
    OPENBLAS_CORETYPE=Haswell timeout 60 "$LAUNCH" -n 2 -- "$COC" env >"$TMP/onednn" 2>&1
    check "AVX-512: oneDNN runs the fp32 GEMMs" grep -Eq "^GEMM back end: +onednn for fp32" "$TMP/onednn"
    check "AVX-512: no blas-core warning while oneDNN runs the GEMMs" bash -c "! grep -q 'blas-core' '$TMP/onednn'"
    # coc train repeats the warning only where OpenBLAS runs its GEMMs.
    T1=(train --train-iters 1 --sample-length 0 --no-progress)
    OPENBLAS_CORETYPE=Haswell timeout 60 "$LAUNCH" -n 2 -- "$COC" "${T1[@]}" >"$TMP/train_onednn" 2>&1
    check "coc train on oneDNN: no OpenBLAS kernel warning" bash -c "! grep -q 'OpenBLAS runs its' '$TMP/train_onednn'"
    OPENBLAS_CORETYPE=Haswell timeout 60 "$LAUNCH" -n 2 -- "$COC" "${T1[@]}" --gemm-backend openblas \
      >"$TMP/train_openblas" 2>&1
    check "coc train --gemm-backend openblas: the kernel warning" grep -q "OpenBLAS runs its Haswell kernels" \
      "$TMP/train_openblas"
  fi
else
  echo "skip BLAS kernel checks: this CPU has no vector extension above SSE3"
fi

# oneDNN (coc/kernels/gemm.h): its version, ISA and kernels; bf16 without bf16 units is warned about with its cost.
# ONEDNN_MAX_CPU_ISA (oneDNN's own variable) caps the ISA oneDNN may use, which stands in for an older CPU.
check "oneDNN line" grep -Eq "^oneDNN: +[0-9]+\.[0-9]+\.[0-9]+, ISA [a-z0-9_]+: fp32 [a-z]" "$TMP/env2"
check "JSON gemm object" grep -q '"bf16_native"' "$TMP/json"
if grep -q '"onednn_isa": "avx512' "$TMP/json"; then
  ONEDNN_MAX_CPU_ISA=AVX512_CORE timeout 60 "$LAUNCH" -n 1 -- "$COC" env >"$TMP/emulated" 2>&1
  check "AVX-512 without BF16: bf16-emulated warning with the cost" \
    grep -Eq "\[bf16-emulated\].*emulates bf16 GEMMs .*slower than fp32" "$TMP/emulated"
  ONEDNN_MAX_CPU_ISA=AVX2 timeout 60 "$LAUNCH" -n 1 -- "$COC" env >"$TMP/avx2only" 2>&1
  check "AVX2 only: no bf16 matmul, said once" grep -Eq "\[bf16-emulated\].*no bf16 matmul" "$TMP/avx2only"
  check "AVX2 only: OpenBLAS runs the fp32 GEMMs" grep -Eq "^GEMM back end: +openblas" "$TMP/avx2only"
fi
if grep -q '"bf16_native": true' "$TMP/json"; then
  check "native bf16: no bf16-emulated warning" bash -c "! grep -q 'bf16-emulated' '$TMP/env2'"
fi
if grep -q '"amx_unused": true' "$TMP/json"; then  # an AMX CPU whose oneDNN cannot use it (Linux before 5.16)
  check "AMX unused: bf16-no-amx warning" grep -q "bf16-no-amx" "$TMP/env2"
else
  check "AMX used or absent: no bf16-no-amx warning" bash -c "! grep -q 'bf16-no-amx' '$TMP/env2'"
fi
# On a CPU with AMX, capping oneDNN below it leaves AMX unused: warned, with the fix.
if grep -q '"onednn_isa": "avx512_core_amx"' "$TMP/json"; then
  ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 timeout 60 "$LAUNCH" -n 1 -- "$COC" env >"$TMP/noamx" 2>&1
  check "AMX capped away: bf16-no-amx warning" grep -Eq "\[bf16-no-amx\].*has AMX-BF16, but oneDNN runs" "$TMP/noamx"
  check "AMX capped away: the fix names ONEDNN_MAX_CPU_ISA" grep -q "unset ONEDNN_MAX_CPU_ISA" "$TMP/noamx"
fi
COC_GEMM_BACKEND=mkl timeout 60 "$LAUNCH" -n 1 -- "$COC" env >"$TMP/badbackend" 2>&1 && rc=0 || rc=$?
check "COC_GEMM_BACKEND=mkl: refused" test "$rc" -ne 0
check "COC_GEMM_BACKEND=mkl: one line naming it" grep -q "COC_GEMM_BACKEND 'mkl' is not a GEMM back end" "$TMP/badbackend"

# A small /dev/shm (64 MB in containers) crashes shared-memory transports with SIGBUS (edge case 17): coc env warns
# with the fix. Mounts a 64 MiB tmpfs over /dev/shm in a private mount namespace (root only; skipped otherwise).
if unshare -m true 2>/dev/null; then
  unshare -m sh -c "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec timeout 60 '$COC' env" >"$TMP/shm" 2>/dev/null
  check "64 MiB /dev/shm: shm-small warning" grep -q "\[shm-small\]" "$TMP/shm"
else
  echo "skip /dev/shm check: unshare -m is not permitted here"
fi
finish
