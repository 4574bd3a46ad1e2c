# ringtrain — two front doors: `make demo` and `make test`. Both set up from nothing.
#
# TORCH is pinned because an unpinned `torch` pulls several GB of CUDA wheels;
# override it for a GPU machine, e.g. `make test TORCH="torch==2.13.0 --index-url ..."`.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.ringtrain-installed
# Bytecode for the package and the tests, written before each run: where PYTHONDONTWRITEBYTECODE is set (this
# machine sets it) every process would otherwise compile ringtrain's ~200 modules from source as it imports them,
# ~1.8 s of CPU per worker the suite starts (docs/benchmarks.md, "What importing the Ring costs").
BYTECODE = $(PY) -m compileall -q -j 0 src tests examples > /dev/null

GPU_CHECK_OUT ?= gpu-check-report

.PHONY: docs-shots demo test test-fast test-stress test-compile test-load test-hosts test-cluster test-gpu gpu-check bench-overhead docs docs-check install clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[dev,bench,monai,docs]"
	touch $(STAMP)

install: $(STAMP)

# The main job: a CNN on scikit-learn's real handwritten digits, DDP on 2 processes. On the CPU
# (Gloo) by default, whatever the machine has: 2 processes on a one-GPU machine would share its
# GPU, which ringtrain refuses. `make demo DEMO_DEVICE=auto` uses one GPU per process when there are 2.
DEMO_DEVICE ?= cpu
demo: $(STAMP)
	$(BYTECODE)
	$(VENV)/bin/ringtrain run --nproc-per-node 2 examples/digits.py --epochs 8 --out runs/digits --device $(DEMO_DEVICE)

# The whole suite on CPU (Gloo over 127.0.0.1). Pytest exits 5 when it collects no
# test, and make passes that on as a failure.
test: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q

# The edit loop (about a minute on 2 cores): the layer rules, every in-process unit test, and a few
# multi-process ones (the Ring, checkpoint files, DDP's comm hooks). `make test` is what CI runs.
FAST_TESTS = tests/test_layers.py tests/test_docs.py tests/test_site.py tests/test_readme.py tests/test_ring.py tests/doctor tests/parallel tests/loop/test_optim.py \
	tests/loop/test_precision.py tests/loop/test_data.py tests/liveness/test_procs.py tests/liveness/test_activity.py \
	tests/liveness/test_seal.py tests/liveness/test_failures.py tests/liveness/test_membership.py \
	tests/checkpoint/test_untrusted.py tests/checkpoint/test_before_the_move.py tests/checkpoint/test_policy.py \
	tests/checkpoint/test_fingerprint.py tests/checkpoint/test_files.py tests/launcher/test_flag_parity.py \
	tests/launcher/test_torchrun_flags.py tests/launcher/test_horovod_flags.py tests/launcher/test_launch_cli.py \
	tests/launcher/test_launch_scripts.py tests/launcher/test_report.py tests/launcher/test_horovod_run.py \
	tests/launcher/test_launch_ports.py tests/bench/test_bench_parts.py tests/comm/test_checks.py \
	tests/comm/test_ddp_hooks.py tests/strategies/test_objects.py tests/strategies/test_dp.py \
	tests/tracking/test_table.py tests/tracking/test_run_log.py tests/tracking/test_progress.py \
	tests/horovod/test_hvd_errors.py
test-fast: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q $(FAST_TESTS)

# Soak and full-matrix runs (tens of minutes on 2 cores): 200 save/close cycles under CPU load,
# 200 finished jobs with no abort at exit, every way a rank can leave x every launcher.
test-stress: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q -s -m stress

# The real torch.compile equal to eager (tests/strategies/test_compiling.py; minutes cold on 2 cores, one inductor
# cache folder reused: TORCHINDUCTOR_CACHE_DIR).
test-compile: $(STAMP)
	$(PY) -m pytest -q -m compile tests/strategies/test_compiling.py

# The suite under load (issue 21): `.ci/run` on a fresh clone of HEAD, three times in a row, each
# beside two busy loops; stops at the first failure. About 45 minutes a run on 2 cores. RUNS= and HOGS= change it.
test-load:
	scripts/suite_under_load.sh HEAD

# Remote hosts for real: an OpenSSH server on 127.0.0.2 (started by the tests, with a key they make)
# and `ringtrain run -H 127.0.0.1:1,127.0.0.2:1` / --hostfile / --nnodes with node 1 over ssh.
# `make test` runs them too where sshd is installed and it runs as root; here openssh-server is
# installed first (Debian/Ubuntu, as root), and a skip fails the target.
test-hosts: $(STAMP)
	command -v sshd >/dev/null 2>&1 || test -x /usr/sbin/sshd || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client)
	@out=$$($(PY) -m pytest -q -rs tests/launcher/test_launch_ssh.py 2>&1); status=$$?; echo "$$out"; \
		test $$status -eq 0 && ! echo "$$out" | grep -q SKIPPED

# Real schedulers on this machine (issue 32): a Slurm cluster of this host (munged, slurmctld, two slurmd; written
# and started by scripts/one_node_slurm.sh, stopped at the end), srun / sbatch of examples/cluster/, a failing rank,
# preemption with requeue, `ringtrain run` agents under srun, mpirun -np 2 and the PyTorchJob's command: tests/cluster.
# Installs slurm-wlm, munge and openmpi-bin first where they are missing (Debian/Ubuntu, as root); a skip fails it.
# 3-6 minutes on 2 shared cores (docs/benchmarks.md). `make test` runs tests/cluster's unmarked ones where installed.
test-cluster: $(STAMP)
	@missing=""; command -v slurmd >/dev/null 2>&1 || missing="slurm-wlm munge"; \
		command -v munged >/dev/null 2>&1 || case "$$missing" in *munge*) ;; *) missing="$$missing munge";; esac; \
		command -v mpirun >/dev/null 2>&1 || missing="$$missing openmpi-bin"; \
		if [ -n "$$missing" ]; then \
			missing=$$(echo $$missing); \
			if [ "$$(id -u)" != 0 ]; then echo "test-cluster: not installed: $$missing; run as root to install them"; exit 1; fi; \
			echo "test-cluster: installing $$missing"; apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing || exit 1; \
		fi
	@out=$$($(PY) -m pytest -q -rs -m "not stress" --durations=0 tests/cluster 2>&1); status=$$?; echo "$$out"; \
		test $$status -eq 0 && ! echo "$$out" | grep -q SKIPPED

# GPU-marked tests only (they skip cleanly without CUDA).
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

# Every CUDA/NCCL path in order, each under a timeout; report in $(GPU_CHECK_OUT)/report.md.
# Installs nothing (no $(STAMP)): it checks the torch of $(PYTHON), e.g. a GPU machine's own
# `make gpu-check PYTHON=/opt/conda/bin/python`, or the venv's `make gpu-check PYTHON=$(PY)`.
# Without a GPU it reports "no GPU: skipped" and succeeds. See scripts/gpu_check.sh.
gpu-check:
	PYTHON="$(PYTHON)" scripts/gpu_check.sh "$(GPU_CHECK_OUT)"

# The guide as a website in site/ (not committed): docs/api.md written from the public names' docstrings
# (scripts/api_reference.py, plain inspect), then MkDocs with Material builds README.md, README.zh-CN.md and docs/
# with warnings as errors (mkdocs.yml; scripts/site_hooks.py: README.md is the front page, the menu is its guide
# map, the files the guide links to get pages). tests/test_site.py builds it too and follows every link it made.
docs: $(STAMP)
	$(PY) scripts/api_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# Pictures of the built site's front page, API page and Chinese front page in headless Chromium (docs-shots/, not
# committed): look at them after changing a page's layout. Installs Debian's chromium (as root) where it is missing.
docs-shots: docs
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-wqy-microhei)
	$(PY) scripts/page_shots.py site docs-shots "" api/ index.zh-CN/

docs-check: $(STAMP)
	$(PY) scripts/api_reference.py --check
	$(PY) -m pytest -q tests/test_docs.py tests/test_readme.py tests/test_site.py

bench-overhead: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs bench-out .pytest_cache $(GPU_CHECK_OUT) docs-shots site
