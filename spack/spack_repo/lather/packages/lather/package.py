# Spack recipe of Lather, written the way the builtin recipes of Kokkos-based libraries
# (arborx, cabana) are: Kokkos backends are Kokkos' own variants, and Lather's cuda / rocm
# variants only propagate the device architecture down to kokkos and kokkos-kernels.
#
# Package API v2 (the spack_repo/<namespace>/packages/<name>/package.py layout, imports from
# spack_repo.builtin.build_systems): Spack >= 1.0 with the spack-packages builtin repository
# (>= v2025.07). Validated with Spack v1.1.0; Spack 0.x (package API v1) is not supported.
# See docs/spack.md.
import os
import re
import struct

from spack_repo.builtin.build_systems.cmake import CMakePackage
from spack_repo.builtin.build_systems.cuda import CudaPackage
from spack_repo.builtin.build_systems.rocm import ROCmPackage

from spack.package import *


class Lather(CMakePackage, CudaPackage, ROCmPackage):
    """Distributed Shampoo (a second-order optimizer) and the gradient collectives of
    data-parallel training for Kokkos + MPI, in C++17, with parallel HDF5 checkpoints and a
    Fashion-MNIST training driver (lather-train)."""

    homepage = "https://github.com/lather-hpc/lather"
    git = "https://github.com/lather-hpc/lather.git"

    # Without network, point these at a local clone (docs/spack.md, "Installing from a local
    # clone"): packages.yaml  packages: lather: package_attributes: git: file:///path/to/clone
    version("main", branch="main")
    version("0.1.0", tag="v0.1.0", commit="da9dfb2c54ae56b84d29f2e9c7dc55bad38548bb")

    variant("shared", default=True, description="Build liblather as a shared library")
    variant("mpi", default=True, description="Collectives, distributed Shampoo and checkpoints over MPI")
    variant("hdf5", default=True, description="Parallel HDF5 checkpoints (needs +mpi)")
    variant("drivers", default=True, description="Build the lather-train driver (needs +mpi +hdf5)")
    variant("benchmarks", default=True, description="Build lather-bench")
    variant("openmp", default=False, description="Use Kokkos' OpenMP backend")
    variant(
        "gpu_aware_mpi",
        default=False,
        when="+mpi",
        description="Hand device buffers to MPI directly (only with a CUDA/ROCm-aware MPI)",
    )

    # Same rules as Lather's CMakeLists.txt (cmake_dependent_option). Variant defaults are soft
    # in Spack: `lather~mpi` concretizes to lather~mpi~hdf5~drivers, while an explicit
    # `lather~mpi+hdf5` or `lather~mpi+drivers` is refused with the message below.
    conflicts("+hdf5", when="~mpi", msg="Lather's HDF5 checkpoints are parallel HDF5: +hdf5 needs +mpi")
    conflicts("+drivers", when="~mpi", msg="lather-train needs +mpi")
    conflicts("+drivers", when="~hdf5", msg="lather-train needs +hdf5")
    conflicts("+gpu_aware_mpi", when="~cuda ~rocm", msg="+gpu_aware_mpi needs +cuda or +rocm")

    # Kokkos supports one device backend and one architecture at a time.
    conflicts("+cuda", when="+rocm", msg="CUDA and ROCm are not compatible in Kokkos")
    conflicts("+cuda", when="cuda_arch=none", msg="+cuda needs cuda_arch=<one architecture>")
    conflicts("+rocm", when="amdgpu_target=none", msg="+rocm needs amdgpu_target=<one target>")

    depends_on("c", type="build")  # project(... LANGUAGES C CXX); FindMPI / FindHDF5 use C
    depends_on("cxx", type="build")
    depends_on("cmake@3.18:", type="build")

    # Kokkos and Kokkos Kernels: standard installs (CMake targets Kokkos::kokkos and
    # Kokkos::kokkoskernels), version 4 or later; kokkos-kernels pins the matching kokkos.
    depends_on("kokkos@4:")
    depends_on("kokkos-kernels@4:")
    # On the host, KokkosBlas::gemm calls the BLAS provider only with kokkos-kernels+blas (off in
    # the builtin recipe); without it the GEMMs of training run 1.5-6x slower (docs/spack.md).
    depends_on("kokkos-kernels+blas+lapack", when="~cuda ~rocm")
    # On NVIDIA GPUs the same GEMMs go to cuBLAS (Lather's Newton iterations are GEMM chains).
    # Not done for ROCm: with spack-packages v2025.11, kokkos-kernels+rocblas concretizes only
    # with Kokkos 4.2; add ^kokkos-kernels+rocblas by hand where your ROCm stack allows it.
    depends_on("kokkos-kernels+cublas", when="+cuda")
    depends_on("kokkos+openmp", when="+openmp")
    depends_on("kokkos-kernels+openmp", when="+openmp")

    # Propagate the CUDA architecture down to Kokkos and Kokkos Kernels (as arborx / cabana do).
    for _arch in CudaPackage.cuda_arch_values:
        _cuda_dep = f"+cuda cuda_arch={_arch}"
        depends_on(f"kokkos {_cuda_dep}", when=_cuda_dep)
        depends_on(f"kokkos-kernels {_cuda_dep}", when=_cuda_dep)
    # Lather's kernels are KOKKOS_LAMBDAs on the device.
    depends_on("kokkos+cuda_lambda", when="+cuda")
    # With a GNU host compiler Kokkos' CUDA backend is compiled by nvcc_wrapper (kokkos +wrapper),
    # and so is Lather (CMAKE_CXX_COMPILER = kokkos_cxx below).
    depends_on("kokkos+wrapper", when="+cuda %cxx=gcc")

    # Propagate the AMD GPU target down to Kokkos (kokkos-kernels follows its kokkos).
    for _arch in ROCmPackage.amdgpu_targets:
        _rocm_dep = f"+rocm amdgpu_target={_arch}"
        depends_on(f"kokkos {_rocm_dep}", when=_rocm_dep)

    depends_on("mpi", when="+mpi")
    depends_on("hdf5+mpi", when="+hdf5")
    depends_on("blas")
    depends_on("lapack")  # eigh inverse-root method
    depends_on("zlib-api")  # IDX data reader (.gz)
    depends_on("cli11", when="+drivers")
    depends_on("cli11", when="+benchmarks")
    depends_on("nlohmann-json", when="+drivers")
    depends_on("nlohmann-json", when="+benchmarks")

    # Lather's own test suite (spack install --test=root): GoogleTest, JSON reference data.
    depends_on("googletest", type="test")
    depends_on("nlohmann-json", type="test")

    # FindBLAS / FindLAPACK vendor names of common providers (anything else: CMake's search).
    _bla_vendors = {"openblas": "OpenBLAS", "netlib-lapack": "Generic", "amdblis": "AOCL"}

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("BUILD_SHARED_LIBS", "shared"),
            self.define_from_variant("LATHER_ENABLE_MPI", "mpi"),
            self.define_from_variant("LATHER_ENABLE_HDF5", "hdf5"),
            self.define_from_variant("LATHER_ENABLE_DRIVERS", "drivers"),
            self.define_from_variant("LATHER_ENABLE_BENCHMARKS", "benchmarks"),
            self.define("LATHER_ENABLE_TESTS", self.run_tests),
            self.define(
                "LATHER_ENABLE_CUDA_AWARE_MPI", spec.satisfies("+mpi +gpu_aware_mpi")
            ),
            self.define("Kokkos_ROOT", spec["kokkos"].prefix),
            self.define("KokkosKernels_ROOT", spec["kokkos-kernels"].prefix),
            # Spack's compiler wrappers add the target's -march (spec.target): Lather adds none.
            self.define("LATHER_ARCH", ""),
        ]

        # The C++ compiler of a Kokkos device backend, as arborx / cabana / kokkos-kernels do.
        if spec.satisfies("^kokkos+rocm"):
            args.append(self.define("CMAKE_CXX_COMPILER", spec["hip"].hipcc))
        elif spec.satisfies("^kokkos+cuda"):
            args.append(self.define("CMAKE_CXX_COMPILER", self["kokkos"].kokkos_cxx))

        if spec.satisfies("+mpi"):
            args.append(self.define("MPI_C_COMPILER", spec["mpi"].mpicc))
            args.append(self.define("MPI_CXX_COMPILER", spec["mpi"].mpicxx))

        for provider, vendor in self._bla_vendors.items():
            if spec["lapack"].name == provider:
                args.append(self.define("BLA_VENDOR", vendor))

        if self.run_tests and spec.satisfies("+mpi"):
            # The MPI tests run under the launcher of the mpi dependency, OpenMP at 1 thread.
            mpiexec = self._mpi_launcher()
            if mpiexec:
                args.append(self.define("MPIEXEC_EXECUTABLE", mpiexec[0]))
        return args

    # ---- stand-alone tests: spack test run lather -------------------------------------------

    def _mpi_launcher(self):
        """The MPI launcher: $LATHER_TEST_MPIEXEC (e.g. "srun -A myproject"), else mpiexec or
        mpirun of the mpi dependency, else srun on PATH."""
        custom = os.environ.get("LATHER_TEST_MPIEXEC")
        if custom:
            return custom.split()
        for name in ("mpiexec", "mpirun"):
            path = join_path(self.spec["mpi"].prefix.bin, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return [path]
        srun = which_string("srun")
        return [srun] if srun else None

    def _run(self, program, args, ranks):
        """Run an installed program, under the MPI launcher with `ranks` ranks when +mpi,
        one OpenMP thread per rank; returns stdout + stderr."""
        command = [join_path(self.prefix.bin, program)] + args
        if self.spec.satisfies("+mpi"):
            launcher = self._mpi_launcher()
            if not launcher:
                raise SkipTest("no MPI launcher found (set LATHER_TEST_MPIEXEC)")
            command = launcher + ["-n", str(ranks)] + command
        exe = Executable(command[0])
        exe.add_default_env("OMP_NUM_THREADS", "1")
        exe.add_default_env("OMP_PROC_BIND", "false")
        return exe(*command[1:], output=str.split, error=str.split)

    @staticmethod
    def _write_idx(directory, split, count):
        """Write a tiny Fashion-MNIST-shaped IDX data set (28 x 28 unsigned bytes, labels
        0..9). Class k has a bright band in rows 2k+4 .. 2k+6, so one epoch learns it."""
        images = bytearray(struct.pack(">IIII", 0x00000803, count, 28, 28))
        labels = bytearray(struct.pack(">II", 0x00000801, count))
        for i in range(count):
            label = (i * 7) % 10
            image = bytearray(28 * 28)
            for row in range(2 * label + 4, 2 * label + 7):
                for col in range(4, 24):
                    image[row * 28 + col] = 160 + (i * 13 + col * 5) % 96
            images += image
            labels.append(label)
        with open(join_path(directory, f"{split}-images-idx3-ubyte"), "wb") as f:
            f.write(images)
        with open(join_path(directory, f"{split}-labels-idx1-ubyte"), "wb") as f:
            f.write(labels)

    def test_train_one_epoch(self):
        """train one epoch of lather-train (Shampoo, 2 MPI ranks) on a generated tiny data set"""
        if not self.spec.satisfies("+drivers"):
            raise SkipTest("lather-train is built only with +drivers")
        data = join_path(os.getcwd(), "tiny-fashion-mnist")
        mkdirp(data)
        self._write_idx(data, "train", 256)
        self._write_idx(data, "t10k", 128)
        metrics = join_path(os.getcwd(), "metrics.jsonl")
        out = self._run(
            "lather-train",
            ["--data", data, "--epochs", "1", "--hidden", "16", "--batch-size", "16",
             "--train-samples", "256", "--test-samples", "128", "--optimizer", "shampoo",
             "--metrics", metrics],
            ranks=2,
        )
        assert "2 ranks" in out, "lather-train did not run on 2 ranks"
        done = re.search(r"done: (\d+) steps .* test accuracy ([0-9.]+)%", out)
        assert done, "lather-train printed no final 'done: ... test accuracy' line"
        assert int(done.group(1)) == 16, "expected 16 steps (256 samples / batch 16)"
        accuracy = float(done.group(2))
        assert accuracy > 50.0, f"test accuracy {accuracy}% on the separable tiny set"
        with open(metrics) as f:
            assert "test_accuracy" in f.read(), "no test_accuracy in the --metrics file"

    def test_bench_root(self):
        """run a tiny lather-bench root (n 16, batch 2, p 2) and check its JSON lines"""
        if not self.spec.satisfies("+benchmarks"):
            raise SkipTest("lather-bench is built only with +benchmarks")
        out = self._run(
            "lather-bench",
            ["root", "--n", "16", "--batch", "2", "--p", "2", "--gemm-seconds", "0.05"],
            ranks=1,
        )
        lines = [line for line in out.splitlines() if line.startswith("{")]
        methods = set()
        for line in lines:
            assert '"bench":"root"' in line, f"unexpected line: {line}"
            methods.update(re.findall(r'"method":"(\w+)"', line))
            error = re.search(r'"max_error":([-+0-9.eE]+)', line)
            assert error and float(error.group(1)) < 1e-6, f"inverse root error too large: {line}"
        assert methods == {"newton", "eigh"}, f"expected newton and eigh results, got {methods}"
