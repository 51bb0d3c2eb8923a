# sparta: one plain GNU Makefile. Knobs are ?= variables; `make help` lists them and the targets.
#
#   make            build the library, programs, experiment binaries and tests (into $(BUILD))
#   make test       install missing Debian packages (as root), build, run every test suite
#   make demo       the main job on a small synthetic dataset under mpiexec
#   make gpu-bundle build everything for the GPU machine (Open MPI, sm_90) into one folder to copy there

# ---------------------------------------------------------------------------------------------------------
# Knobs
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA      ?= $(if $(wildcard $(NVCC)),1,0)
ARCH      ?= sm_90
PTX       ?= 1
MPI       ?= mpich
DEBUG     ?= 0
PYTHON    ?= /usr/bin/python3
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
TEST_RANKS ?= 1 2 3 4
TEST_TIMEOUT ?= 900
DEMO_RANKS ?= 2

ifeq ($(MPI),mpich)
  MPICXX        ?= mpicxx.mpich
  MPIEXEC       ?= mpiexec.mpich
  MPIEXEC_FLAGS ?=
else ifeq ($(MPI),openmpi)
  MPICXX        ?= mpicxx.openmpi
  MPIEXEC       ?= mpiexec.openmpi
  MPIEXEC_FLAGS ?= --oversubscribe
else
  $(error MPI must be mpich or openmpi, found '$(MPI)')
endif
ifneq ($(CUDA),0)
ifneq ($(CUDA),1)
  $(error CUDA must be 0 or 1, found '$(CUDA)')
endif
endif
ifneq ($(filter-out sm_%,$(ARCH)),)
  $(error ARCH must look like sm_90, found '$(ARCH)')
endif

# Build folder: build/ for the default (MPICH, CUDA when nvcc is there); variants live beside it.
BUILD ?= build$(if $(filter openmpi,$(MPI)),/openmpi)$(if $(filter 0,$(CUDA)),/cpu)

HDF5_CFLAGS ?= $(shell pkg-config --cflags hdf5-serial 2>/dev/null || echo -I/usr/include/hdf5/serial)
HDF5_LIBS   ?= $(shell pkg-config --libs hdf5-serial 2>/dev/null || echo -L/usr/lib/x86_64-linux-gnu/hdf5/serial -lhdf5)
# Boost.Program_options linked statically so binaries run where only Boost headers exist; Boost.Test is
# header-only (tests/main_*.cpp include its implementation once).
BOOST_PO_LIBS ?= -Wl,-Bstatic -lboost_program_options -Wl,-Bdynamic
# OpenBLAS (the CPU reference GEMM of kernels/dense_linear) linked statically into libsparta, its symbols
# kept inside, so the library runs where no BLAS is installed (the GPU machine).
BLAS_LIBS ?= -Wl,--exclude-libs,libopenblas.a -Wl,-Bstatic -lopenblas -Wl,-Bdynamic

# ---------------------------------------------------------------------------------------------------------
# Flags
INCLUDES := -I.   # one root: every include names its room ("src/base/check.h", "comm/communicator.h")
DEFINES  := -DSPARTA_CUDA=$(CUDA) -DSPARTA_DEBUG=$(DEBUG) -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX
OPT      := $(if $(filter 1,$(DEBUG)),-O1 -g,-O3)
CXXFLAGS ?= $(OPT) -std=c++17 -Wall -Wextra -fPIC -pthread
DEPFLAGS  = -MMD -MP
ARCH_NUM := $(patsubst sm_%,%,$(ARCH))
# PTX=1: machine code for ARCH and PTX that newer GPUs compile at load; PTX=0: the machine code alone (a third the
# size: what gpu-bundle builds for a known GPU)
comma := ,
NVCC_CODE := $(if $(filter 1,$(PTX)),[sm_$(ARCH_NUM)$(comma)compute_$(ARCH_NUM)],sm_$(ARCH_NUM))
NVCCFLAGS ?= $(OPT) -std=c++17 -ccbin $(MPICXX) -Xcompiler -fPIC,-Wall,-pthread \
             -gencode arch=compute_$(ARCH_NUM),code=$(NVCC_CODE) \
             --expt-relaxed-constexpr -lineinfo
ifeq ($(CUDA),1)
  CUDA_INC  := -I$(CUDA_HOME)/include
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lnccl -ldl -lrt
endif
ALL_CXXFLAGS = $(CXXFLAGS) $(DEFINES) $(INCLUDES) $(CUDA_INC) $(HDF5_CFLAGS)
ALL_NVCCFLAGS = $(NVCCFLAGS) $(DEFINES) $(INCLUDES) $(HDF5_CFLAGS)
LDLIBS = -Wl,--as-needed $(HDF5_LIBS) $(BOOST_PO_LIBS) $(CUDA_LIBS) -lpthread

# ---------------------------------------------------------------------------------------------------------
# Sources, found by name.
#   src/ kernels/ comm/ io/ *.cpp, *.cu     → $(BUILD)/lib/libsparta.so
#   src/programs/<name>.cpp                 → $(BUILD)/bin/sparta-<name>
#   experiments/bench_<name>.cpp            → $(BUILD)/bin/bench_<name>
#   tests/test_<name>.cpp                   → $(BUILD)/tests/test_<name>      (plain suites)
#   tests/mpi_test_<name>.cpp               → $(BUILD)/tests/mpi_test_<name>  (run under mpiexec)
#   tests/tool_<name>.cpp                   → $(BUILD)/tests/tool_<name>      (programs that tests launch)
#   tests/support_<name>.cpp                → linked into every test binary
#   experiments/support_<name>.cpp          → linked into every experiment binary
#   experiments/lab/*.cpp, *.cu             → linked into bench_embedding and test_row_traffic only (kernels that
#                                             measure, not part of the library: experiments/lab/README.md)
#   src/options.cpp                         → linked into every program, benchmark and test
MODULES   := src/base src kernels comm io
# src/options.cpp uses Boost.Program_options, which Debian ships as a non-PIC static archive: it is linked
# into each program instead of into the shared library.
# src/train_options.cpp (sparta-train's and sparta-predict's options) likewise.
CLI_SRCS  := src/options.cpp src/train_options.cpp
CLI_OBJS  := $(CLI_SRCS:%.cpp=$(BUILD)/obj/%.o)
LIB_CPP   := $(filter-out $(CLI_SRCS),$(foreach m,$(MODULES),$(wildcard $(m)/*.cpp)))
LIB_CU    := $(if $(filter 1,$(CUDA)),$(foreach m,$(MODULES),$(wildcard $(m)/*.cu)))
LIB_OBJS  := $(LIB_CPP:%.cpp=$(BUILD)/obj/%.o) $(LIB_CU:%.cu=$(BUILD)/obj/%.cu.o)
LIBSPARTA := $(BUILD)/lib/libsparta.so

PROGRAM_SRCS := $(wildcard src/programs/*.cpp)
PROGRAMS     := $(PROGRAM_SRCS:src/programs/%.cpp=$(BUILD)/bin/sparta-%)
BENCH_SRCS   := $(wildcard experiments/bench_*.cpp)
BENCHES      := $(BENCH_SRCS:experiments/%.cpp=$(BUILD)/bin/%)
TEST_SRCS    := $(wildcard tests/test_*.cpp)
TESTS        := $(TEST_SRCS:tests/%.cpp=$(BUILD)/tests/%)
MPI_TEST_SRCS := $(wildcard tests/mpi_test_*.cpp)
MPI_TESTS    := $(MPI_TEST_SRCS:tests/%.cpp=$(BUILD)/tests/%)
TOOL_SRCS    := $(wildcard tests/tool_*.cpp)
TOOLS        := $(TOOL_SRCS:tests/%.cpp=$(BUILD)/tests/%)
SUPPORT_OBJS := $(patsubst tests/%.cpp,$(BUILD)/obj/tests/%.o,$(wildcard tests/support_*.cpp))
BENCH_SUPPORT_OBJS := $(patsubst experiments/%.cpp,$(BUILD)/obj/experiments/%.o,$(wildcard experiments/support_*.cpp))
LAB_OBJS     := $(patsubst %.cpp,$(BUILD)/obj/%.o,$(wildcard experiments/lab/*.cpp)) \
                $(if $(filter 1,$(CUDA)),$(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(wildcard experiments/lab/*.cu)))

RPATH := -Wl,-rpath,'$$ORIGIN/../lib'
LINK   = $(MPICXX) $(CXXFLAGS) -o $@ $(filter %.o,$^) -L$(BUILD)/lib -lsparta $(RPATH) $(LDLIBS)

.SECONDARY:   # keep objects: they are intermediate files of the pattern rules
.PHONY: all lib programs benches tests test test-build demo bench deps check-deps gpu-bundle clean help info
.DEFAULT_GOAL := all

all: info $(LIBSPARTA) $(PROGRAMS) $(BENCHES) $(TESTS) $(MPI_TESTS) $(TOOLS)

info:
	@echo "sparta build → $(BUILD)   (MPI=$(MPI): $(MPICXX), $(MPIEXEC); ARCH=$(ARCH); DEBUG=$(DEBUG))"
	@if [ "$(CUDA)" = 1 ]; then echo "  ✓ CUDA: $(NVCC) (cuda backend built; NCCL from $(CUDA_HOME)/lib64)"; \
	 else echo "  ✗ CUDA=0: CPU-only build (cpu backend; no nvcc used)"; fi
	@command -v $(MPICXX) >/dev/null && echo "  ✓ MPI: $(MPICXX)" || echo "  ✗ MPI: $(MPICXX) not found (make deps)"

lib: $(LIBSPARTA)
programs: $(PROGRAMS)
benches: $(BENCHES)
tests: $(TESTS) $(MPI_TESTS) $(TOOLS)

# The CUDA runtime is linked shared, once, and copied beside libsparta so a carried build folder finds it.
$(LIBSPARTA): $(LIB_OBJS)
	@mkdir -p $(@D)
	$(if $(filter 1,$(CUDA)),cp -P $(CUDA_HOME)/lib64/libcudart.so* $(@D)/)
	$(MPICXX) -shared $(CXXFLAGS) -o $@ $^ $(RPATH) $(HDF5_LIBS) $(BLAS_LIBS) $(CUDA_LIBS) -lpthread

$(BUILD)/obj/%.o: %.cpp
	@mkdir -p $(@D)
	$(MPICXX) $(ALL_CXXFLAGS) $(DEPFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(ALL_NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(BUILD)/bin/sparta-%: $(BUILD)/obj/src/programs/%.o $(CLI_OBJS) $(LIBSPARTA)
	@mkdir -p $(@D)
	$(LINK)

$(BUILD)/bin/bench_%: $(BUILD)/obj/experiments/bench_%.o $(BENCH_SUPPORT_OBJS) $(CLI_OBJS) $(LIBSPARTA)
	@mkdir -p $(@D)
	$(LINK)

# The lab's kernels, where they are used (the pattern rules link every object among the prerequisites).
$(BUILD)/bin/bench_embedding $(BUILD)/tests/test_row_traffic: $(LAB_OBJS)

$(BUILD)/tests/test_%: $(BUILD)/obj/tests/test_%.o $(BUILD)/obj/tests/main_plain.o $(SUPPORT_OBJS) $(CLI_OBJS) $(LIBSPARTA)
	@mkdir -p $(@D)
	$(LINK)

$(BUILD)/tests/mpi_test_%: $(BUILD)/obj/tests/mpi_test_%.o $(BUILD)/obj/tests/main_mpi.o $(SUPPORT_OBJS) $(CLI_OBJS) $(LIBSPARTA)
	@mkdir -p $(@D)
	$(LINK)

$(BUILD)/tests/tool_%: $(BUILD)/obj/tests/tool_%.o $(CLI_OBJS) $(LIBSPARTA)
	@mkdir -p $(@D)
	$(LINK)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---------------------------------------------------------------------------------------------------------
# Dependencies: Debian packages. As root: apt-get update, then install what is missing. Otherwise: say what.
DEB_PACKAGES ?= build-essential libmpich-dev mpich libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools \
                libboost-program-options-dev libboost-test-dev libopenblas-dev python3-h5py python3-matplotlib python3-numpy

check-deps:
	@missing=""; \
	if command -v dpkg-query >/dev/null; then \
	  for p in $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	  done; \
	fi; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "sparta: installing missing packages:$$missing"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	else \
	  echo "sparta: missing packages:$$missing"; \
	  echo "  install them:  sudo apt-get install$$missing"; \
	  echo "  (on a cluster: load the modules for an MPI compiler wrapper, HDF5 and Boost, and set MPICXX, HDF5_CFLAGS, HDF5_LIBS)"; \
	  exit 1; \
	fi

deps:
	@$(MAKE) --no-print-directory check-deps

# ---------------------------------------------------------------------------------------------------------
# Tests: every plain suite, then every MPI suite under mpiexec with each of TEST_RANKS ranks (cpu backend
# unless GPUs are there); GPU cases without a GPU are reported as skipped. Last line: "tests: N passed, ...".
test-build: check-deps
	@$(MAKE) --no-print-directory -j$(JOBS) all

test: test-build
	@bash tests/run_all.sh "$(BUILD)" "$(MPIEXEC) $(MPIEXEC_FLAGS)" "$(TEST_RANKS)" "$(TEST_TIMEOUT)"

# ---------------------------------------------------------------------------------------------------------
# Demo: the main job, under mpiexec, on GPUs when there are enough, else on the cpu backend.
demo: check-deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash experiments/demo.sh "$(BUILD)" "$(MPIEXEC) $(MPIEXEC_FLAGS)" "$(DEMO_RANKS)"

# Benchmarks: every experiment binary with its default sweep; JSON lines under results/.
bench: all
	@bash experiments/run_benches.sh "$(BUILD)" "$(MPIEXEC) $(MPIEXEC_FLAGS)"

# ---------------------------------------------------------------------------------------------------------
# The GPU machine has Open MPI, CUDA 13, NCCL, serial HDF5 and Boost headers only: build the whole set
# against Open MPI into build/openmpi (library, programs, benchmarks, tests) in machine code for ARCH alone, carry
# that folder or one of its archives there, and run experiments/gpu_session.sh (or, for the suites alone,
#   bash tests/run_all.sh build/openmpi "mpiexec --oversubscribe" "1 2")
gpu-bundle: check-deps
	@$(MAKE) --no-print-directory -j$(JOBS) MPI=openmpi CUDA=1 ARCH=$(ARCH) PTX=0 all
	@# The revision it was built from travels with it (the copy on the GPU machine may carry another .git state):
	@# experiments/gpu_session.sh exports it as SPARTA_GIT_REV, which the results' provenance records.
	@rev=$$(git rev-parse HEAD 2>/dev/null || echo unknown); git diff --quiet HEAD 2>/dev/null || rev=$$rev-dirty; \
	 echo $$rev > build/openmpi/REVISION
	@# Two archives to carry: everything (the part tests needs the suites), and the programs and benchmarks alone
	@# (every other part), about 20 and 12 MB
	@tar -C build -cf - openmpi/lib openmpi/bin openmpi/tests openmpi/REVISION | xz -9 -T$(JOBS) > build/bundle.tar.xz
	@tar -C build -cf - openmpi/lib openmpi/bin openmpi/REVISION | xz -9 -T$(JOBS) > build/bundle-run.tar.xz
	@echo "GPU bundle: build/openmpi, and as archives build/bundle.tar.xz (with the test suites) and build/bundle-run.tar.xz"
	@echo "            (without); there: experiments/gpu_session.sh build/openmpi|ARCHIVE OUT [PART...]"

clean:
	rm -rf build

help:
	@sed -n '1,8p' Makefile
	@echo "knobs: CUDA_HOME=$(CUDA_HOME) CUDA=$(CUDA) ARCH=$(ARCH) PTX=$(PTX) MPI=$(MPI) DEBUG=$(DEBUG) BUILD=$(BUILD)"
	@echo "       TEST_RANKS='$(TEST_RANKS)' DEMO_RANKS=$(DEMO_RANKS) JOBS=$(JOBS) PYTHON=$(PYTHON)"
