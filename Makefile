# The front door. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Build output lives outside the clone so later runs, CI included, reuse it. RocksDB is not
# compiled: every build links the prebuilt library `make rocksdb` caches (docs/building.md).
export CARGO_TARGET_DIR ?= $(HOME)/.cache/likes/target
LIKES_CACHE ?= $(HOME)/.cache/likes
# One feature set for every debug cargo call (build, test, lint, demo, chaos), so none of them
# compiles the crate again for another: fail points are compiled in and inert until armed
# (docs/testing.md). Release builds (bench, image) carry none.
DEV_FEATURES := --workspace --features likes/failpoints
BUF_VERSION := 1.75.0
BUF := $(LIKES_CACHE)/buf/node_modules/.bin/buf
CARGO ?= cargo
LIKES := $(CARGO_TARGET_DIR)/debug/likes
# The tooling (demo, chaos, bench, loadgen) is a binary of its own; it runs `likes` beside it.
TOOLS := $(CARGO_TARGET_DIR)/debug/likes-tools

.PHONY: checker chaos-selftest up-cluster down-cluster chaos-cluster chaos-cluster-ci hostile rocksdb bench-rocksdb bench-overload stack-prune demo-prereqs image k8s-check k8s-e2e up-regions down-regions test-regions chaos-regions k8s-topics alerts-check deploy-check schema-check help prereqs up down stack-reset stack-status build migrate topics topology demo chaos chaos-build chaos-ci fuzz test test-unit lint fmt buf bench bench-topology bench-api bench-restore bench-import bench-sweep

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

prereqs: ## Check what this machine lacks; as root install it (Debian), else print the apt-get line
	@stack/prereqs.sh stack build lint bench

rocksdb: ## Fetch the prebuilt RocksDB library once (Maven Central's rocksdbjni; every build links it)
	@stack/rocksdb.sh

up: ## Start Kafka and Cassandra on 127.0.0.1 (fetches jars once; idempotent)
	@stack/prereqs.sh stack
	@stack/stack.sh up

down: ## Stop exactly the Kafka and Cassandra processes `make up` started
	@stack/stack.sh down

up-regions: ## Start the two-datacenter Cassandra of docs/multi-region.md (127.0.0.2 region-a, 127.0.0.3 region-b)
	@stack/prereqs.sh stack
	@stack/stack.sh up-regions

down-regions: ## Stop the two regional Cassandra nodes
	@stack/stack.sh down-regions

stack-prune: chaos-build ## Delete the topics and keyspaces failed or killed test runs left (make test does it first)
	$(TOOLS) prune

stack-reset: ## Stop the stack and wipe its data
	@stack/stack.sh reset

stack-status: ## Show what runs and where the logs are
	@stack/stack.sh status

build: ## Build the `likes` binary and the `likes-tools` binary (debug)
	@stack/prereqs.sh build
	@stack/rocksdb.sh
	$(CARGO) build $(DEV_FEATURES) --bins

migrate: build ## Create the CQL keyspace and tables
	$(LIKES) migrate

topics: build ## Create the Kafka topics of topology/
	$(LIKES) topics

topology: up build ## Run dedupe + count in one process against the local stack (Ctrl-C stops)
	$(LIKES) migrate && $(LIKES) topics && LIKES__METRICS__LISTEN=127.0.0.1:9464 $(LIKES) topology

bench: up ## Every benchmark, its ratios against the peers, a sweep of offered load -> bench/report.md (~30 min)
	@stack/prereqs.sh stack build bench
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools bench report

bench-api: up ## The API's capacity (p99 < 150 ms) and latency against a bare LWT loop (~12 min)
	@stack/prereqs.sh build
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools bench api

bench-sweep: up ## Offered load through the whole system as deployed, 1/4x to 4x the API's capacity, goals per level -> bench/sweep/sweep.md (~15 min)
	@stack/prereqs.sh stack build bench
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools bench sweep $(SWEEP_ARGS)

bench-import: up ## likes import of a 10M-row file against bare inserts into the same table; peak memory (BENCH_ROWS=10000000)
	@stack/prereqs.sh stack build
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools bench import --rows $${BENCH_ROWS:-10000000}

bench-restore: up ## Stage 1's restore of a 10M-record changelog against a bare read of it (BENCH_RECORDS=10000000)
	@stack/prereqs.sh stack build
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools bench restore --records $${BENCH_RECORDS:-10000000}

bench-rocksdb: up ## The prebuilt RocksDB against the bundled one built from source: stage 1's restore and drain, ratios in one run (ROUNDS=3)
	@stack/prereqs.sh stack build
	bench/rocksdb-ab.sh

hostile: up ## What hostile clients cost a real user: its success and p99 alone and beside four attacks; the API's RSS and series (~1 min)
	@stack/prereqs.sh build
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools hostile $(HOSTILE_ARGS)

bench-overload: up ## The API at 2x and 4x its capacity under the adaptive write limit (~8 min)
	@stack/prereqs.sh stack build
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools bench overload

bench-topology: up ## The topology against Kafka Streams EOS and a plain consumer (BENCH_EVENTS=1000000)
	@stack/prereqs.sh stack build
	@stack/rocksdb.sh
	$(CARGO) build --release --workspace --bins
	$(CARGO_TARGET_DIR)/release/likes-tools bench topology --events $${BENCH_EVENTS:-1000000}

# A failed demo stops the stack if it was this demo that started it (and says so); a stack
# that was up before stays up. Kafka and Cassandra are fetched and started while the build
# runs (their log is shown once both are done), so a first demo waits for the longer of the
# two, not their sum.
demo-prereqs:
	@stack/prereqs.sh stack build

demo: demo-prereqs ## The main job: api + relay + both stages under load, a viral burst, kill -9 of count, the verdict
	@mkdir -p $(LIKES_CACHE); if stack/stack.sh running; then was_up=yes; else was_up=no; fi; \
	stack/rocksdb.sh || exit 1; \
	echo "demo: starting Kafka and Cassandra while the build runs (log: $(LIKES_CACHE)/stack-up.log)"; \
	stack/stack.sh up >$(LIKES_CACHE)/stack-up.log 2>&1 & up_pid=$$!; \
	$(MAKE) --no-print-directory build; built=$$?; \
	wait $$up_pid; upped=$$?; cat $(LIKES_CACHE)/stack-up.log; \
	if [ $$built -ne 0 ]; then status=$$built; echo "demo: the build failed (above)"; \
	elif [ $$upped -ne 0 ]; then status=$$upped; echo "demo: the stack did not start (above)"; \
	else $(TOOLS) demo; status=$$?; fi; \
	if [ $$status -ne 0 ]; then \
	  if [ $$was_up = no ]; then echo "demo: failed; stopping the stack it started (its logs stay under $(LIKES_CACHE)/stack/logs)"; stack/stack.sh down; \
	  else echo "demo: failed; the stack was up before and stays up (make down stops it)"; fi; \
	fi; exit $$status

# `make chaos RUNS=100 SEED=1`: seeds SEED..SEED+RUNS-1, SECONDS of load at RATE req/s each.
# HORIZON=30 gives the run's processes a 30 s dedupe horizon (default: the topology's 7 days).
RUNS ?= 1
SEED ?= 1
SECONDS_PER_RUN ?= 150
RATE ?= 150
HORIZON ?=
# Chaos runs the product built with fail points: one API's clock is set off by a test-only
# environment variable (LIKES_TEST_CLOCK_SKEW_MS).
CHECKER := $(LIKES_CACHE)/bin/likes-linearizability

chaos-build: build checker
	@stack/prereqs.sh chaos

up-cluster: ## Start the replicated stack: 3 Kafka brokers (KRaft, RF 3) on 127.0.1.1-3 and 3 Cassandra nodes (RF 3) on 127.0.2.1-3
	@stack/prereqs.sh stack
	@stack/cluster.sh up

down-cluster: ## Stop the replicated stack
	@stack/cluster.sh down

# `make chaos-cluster RUNS=20 SEED=1`: seeds SEED..SEED+RUNS-1 on the replicated stack.
chaos-cluster: up-cluster chaos-build ## Fault runs on the replicated stack: leader bounces, a Cassandra node killed, partitions, pauses, clock skews, a write landing late; every edge's history checked for linearizability (MAX_SKEW=2: the product's default margins)
	RUST_LOG=$${RUST_LOG:-warn,scylla=off,librdkafka=off} $(TOOLS) chaos --cluster --seed $(SEED) --runs $(RUNS) --seconds $(SECONDS_PER_RUN) --rate $(RATE) \
	  $(if $(MAX_SKEW),--max-skew-s $(MAX_SKEW)) --report $(LIKES_CACHE)/chaos-cluster-report.json

chaos-cluster-ci: up-cluster chaos-build ## What CI runs on the replicated stack: one seed of 90 s at 40/s with a leader bounce, a Cassandra node killed, a partition, a pause, a skew and a late write
	RUST_LOG=$${RUST_LOG:-warn,scylla=off,librdkafka=off} $(TOOLS) chaos --cluster --seed $${CHAOS_SEED:-1} --runs 1 --seconds 90 --rate 40 --extra-faults 1 \
	  --report $(LIKES_CACHE)/chaos-cluster-report.json

checker: ## Build the history checker of the chaos runs (Go + Porcupine, tools/linearizability) and run its tests
	cd tools/linearizability && go test ./... && go build -o $(CHECKER) .

# Each check must report the bug made for it: an API that acknowledges writes it never makes
# (the history check), and a stage 1 that loses or doubles one delta while committing its
# state as if sent once (the pipeline-alone and silent-drift checks).
chaos-selftest: up stack-prune ## Three 20 s chaos runs, each with a fail point that breaks exactness one way: each must FAIL the check made for it (exit 0 when all do)
	@RUST_LOG=$${RUST_LOG:-warn,scylla=off,librdkafka=off} $(TOOLS) chaos --seed 9 --runs 1 --seconds 20 --rate 60 --no-faults \
	  --api-failpoints 'api-lose-write=3%return' --report $(LIKES_CACHE)/chaos-selftest.json; rc=$$?; \
	python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]["linearizability"]; print("chaos-selftest: illegal edges", r["illegal"], "of", r["edges"]); sys.exit(0 if r["illegal"] > 0 else 1)' $(LIKES_CACHE)/chaos-selftest.json \
	  && [ $$rc -ne 0 ] && echo "chaos-selftest: the run failed as it must" || { echo "chaos-selftest: the lost writes went unreported" >&2; exit 1; }
	@for fp in dedupe-drop-delta dedupe-double-delta; do \
	  RUST_LOG=$${RUST_LOG:-warn,scylla=off,librdkafka=off} $(TOOLS) chaos --seed 9 --runs 1 --seconds 20 --rate 60 --no-faults \
	    --stage-failpoints "$$fp=1*return" --report $(LIKES_CACHE)/chaos-selftest-$$fp.json; rc=$$?; \
	  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; v=r["verdict"]; print("chaos-selftest:", sys.argv[2], "pipeline alone exact", r["pipeline_alone_exact"], "silent drift", v["silent_drift"], "drifted items", v["drift_items"]); sys.exit(0 if not r["pipeline_alone_exact"] and v["silent_drift"] > 0 and v["drift_items"] > 0 else 1)' $(LIKES_CACHE)/chaos-selftest-$$fp.json $$fp \
	    && [ $$rc -ne 0 ] && echo "chaos-selftest: $$fp: the run failed as it must" || { echo "chaos-selftest: $$fp: the miscount went unreported" >&2; exit 1; }; \
	done

chaos: up stack-prune ## Fault runs: kill -9 of every process, the broker and Cassandra, two reconciles at once, 3 APIs (one skewed) under load; HORIZON=30 for a short dedupe horizon; exact counts or a non-zero exit
	RUST_LOG=$${RUST_LOG:-warn,scylla=off,librdkafka=off} $(TOOLS) chaos --seed $(SEED) --runs $(RUNS) --seconds $(SECONDS_PER_RUN) --rate $(RATE) \
	  $(if $(HORIZON),--horizon $(HORIZON)) --report $(LIKES_CACHE)/chaos-report.json

chaos-ci: up stack-prune ## The short single-node chaos run CI does: 1 seed of 60 s with a 20 s dedupe horizon (leftover test topics pruned first: the broker's restarts load every log)
	RUST_LOG=$${RUST_LOG:-warn,scylla=off,librdkafka=off} $(TOOLS) chaos --seed $$(( $${CHAOS_SEED:-1} + 1 )) --runs 1 --seconds 60 --rate 100 --extra-faults 3 \
	  --horizon 20 --report $(LIKES_CACHE)/chaos-report-horizon.json

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := like_event delta_record http_input session_token
fuzz: ## Run each fuzz target (decoders of outside bytes) for FUZZ_SECONDS (nightly; installs cargo-fuzz)
	@command -v cargo-fuzz >/dev/null || { echo "fuzz: installing cargo-fuzz from crates.io"; cargo install cargo-fuzz --locked; }
	@stack/rocksdb.sh
	@for t in $(FUZZ_TARGETS); do \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  cargo +nightly fuzz run --fuzz-dir fuzz --target-dir $(LIKES_CACHE)/fuzz-target $$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 2>&1 | tee $(LIKES_CACHE)/fuzz-$$t.log | grep -E "^(stat::|==|SUMMARY|Done)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || { echo "fuzz: $$t found a crash (fuzz/artifacts/$$t/)"; exit 1; }; \
	done

# The stack is fetched and started while the tests build (its log is shown once both are done).
test: ## Run every test (unit, real-stack, kill -9 and fail-point tests; starts the stack)
	@stack/prereqs.sh stack build
	@stack/rocksdb.sh
	@mkdir -p $(LIKES_CACHE); stack/stack.sh up >$(LIKES_CACHE)/stack-up.log 2>&1 & up_pid=$$!; \
	$(CARGO) build $(DEV_FEATURES) --bins && $(CARGO) test $(DEV_FEATURES) --all-targets --no-run; built=$$?; \
	wait $$up_pid; upped=$$?; cat $(LIKES_CACHE)/stack-up.log; \
	if [ $$built -ne 0 ]; then echo "make test: the build failed (above)"; exit $$built; fi; \
	if [ $$upped -ne 0 ]; then echo "make test: the stack did not start (above)"; exit $$upped; fi
	$(TOOLS) prune || echo "make test: the prune failed (see above); testing anyway"
	LIKES_CACHE=$(LIKES_CACHE) CARGO=$(CARGO) stack/run_tests.py $(DEV_FEATURES)

test-regions: up-regions ## The tests against the two-datacenter Cassandra (tests/regions.rs, regions_count.rs, regions_down.rs, regions_import.rs)
	@stack/prereqs.sh build
	@stack/rocksdb.sh
	$(CARGO) test $(DEV_FEATURES) --test regions --test regions_count --test regions_down --test regions_import -- --include-ignored

# `make chaos-regions RUNS=10 SEED=1`: the two-region fault run (tests/regions_count.rs) for seeds SEED..SEED+RUNS-1.
chaos-regions: up-regions ## Moves under kill -9 of either region's stages and Cassandra nodes, one run per seed (RUNS, SEED)
	@stack/prereqs.sh build
	@stack/rocksdb.sh
	@for seed in $$(seq $(SEED) $$(( $(SEED) + $(RUNS) - 1 ))); do \
	  echo "chaos-regions: seed $$seed"; \
	  LIKES_REGIONS_SEED=$$seed $(CARGO) test $(DEV_FEATURES) --test regions_count -- --include-ignored --exact \
	    counts_stay_exact_when_either_regions_stages_and_nodes_die_during_moves --nocapture || exit 1; \
	done

test-unit: ## Only the tests that need no stack (unit tests of the product and the tools; seconds once built)
	@stack/prereqs.sh build
	@stack/rocksdb.sh
	$(CARGO) test $(DEV_FEATURES) --lib --bins

lint: buf ## rustfmt, clippy -D warnings, buf lint
	$(CARGO) fmt --all -- --check
	@stack/rocksdb.sh
	$(CARGO) clippy $(DEV_FEATURES) --all-targets -- -D warnings
	cd schemas && $(BUF) lint

image: ## Build the `likes` image daemonless (buildah), save it as an OCI archive, run it (needs `make up`)
	@stack/prereqs.sh build deploy
	image/build.sh

k8s-check: ## Build every k8s/ overlay; validate offline (Kubernetes + CRD schemas), deployment rules, checkov
	@stack/prereqs.sh deploy
	k8s/check/k8s-check.sh

k8s-e2e: ## Apply both overlays to a real control plane (apiserver, controllers, kwok nodes) and check what it makes of them
	@stack/prereqs.sh deploy k8s
	k8s/e2e/e2e.sh

k8s-topics: ## Regenerate the prod overlay's Strimzi KafkaTopics from topology/
	k8s/check/kafka_topics.py > k8s/components/strimzi-topics/kafka-topics.yaml

alerts-check: ## promtool check rules + promtool test rules on the PrometheusRule
	@stack/prereqs.sh deploy
	. k8s/check/tools.sh && PYTHON=$$PY k8s/check/alerts.sh

deploy-check: schema-check k8s-check alerts-check ## Every deploy check CI runs but the image: schemas, manifests, alerts

# The released schema set `buf breaking` compares against (schemas/released/; see docs/architecture.md,
# "Records and their schemas"). buf refuses a baseline inside the module it checks, so it reads it as a tar.
SCHEMA_BASELINE ?= v1.0.0
schema-check: buf ## buf lint, buf breaking against the last released schemas, the golden byte tests
	cd schemas && $(BUF) lint
	tar -C schemas/released/$(SCHEMA_BASELINE) -cf - . | (cd schemas && $(BUF) breaking --against '-#format=tar')
	@echo "schema-check: no breaking change against schemas/released/$(SCHEMA_BASELINE)"
	@stack/rocksdb.sh
	$(CARGO) test $(DEV_FEATURES) --test schema_golden

fmt: ## Format the code
	$(CARGO) fmt --all

buf: $(BUF)
$(BUF):
	@stack/prereqs.sh lint
	npm install --silent --no-audit --no-fund --prefix $(LIKES_CACHE)/buf @bufbuild/buf@$(BUF_VERSION)
