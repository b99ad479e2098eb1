# rebound. Quick start: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.7.0
# -parallel 4: the parallel broker tests mostly wait on delays and the
# broker, so four at a time on two cores (go test's default is GOMAXPROCS)
# took the end-to-end package from 310 s to 196 s on 4.3, quiet.
# -timeout 60m: on a machine about three times slower than usual the
# disturbing tests' run took past 30 minutes (TestNoLossUnderMemoryAlarm
# alone 1435 s on 4.3), and go test's timeout stopped them mid-scenario.
GO_TEST_FLAGS ?= -race -count=1 -parallel 4 -timeout 60m
# The release version (VERSION, kept with CHANGELOG.md) and the revision
# it is built from, stamped into the binary (internal/buildinfo).
VERSION ?= $(shell cat VERSION 2>/dev/null || echo dev)
REVISION ?= $(shell git describe --always --dirty --abbrev=12 --exclude='*' 2>/dev/null || echo unknown)
# The broker test matrix (internal/brokertest): Debian 12's RabbitMQ 3.10
# on 5672 and Debian sid's RabbitMQ 4.3 in a chroot on 5674.
BROKERS := 3.10 4.3
# Tests that disturb a whole broker, built with the chaos tag (e2e/chaos_test.go, e2e/cluster_test.go).
CHAOS_TESTS := ^(TestNoLossUnderMemoryAlarm|TestLargeMessagesUnderMemoryAlarm|TestNoLossWhenBrokerRestarts)$$
CLUSTER_TESTS := ^TestCluster

.PHONY: demo run test prepare helm test-binaries build lint alerts broker brokers clients bench chaos flaketest plots dist release release-test

# The demo: rebound plus an application that fails every message.
demo: broker build
	./scripts/demo.sh

# Runs rebound alone against the local broker, in the foreground.
run: broker build
	./bin/rebound run

# The whole test suite against both brokers of the matrix: formatting, vet,
# staticcheck, a tidy go.mod, the alerting rules' unit tests, then for each
# broker, both brokers at once (scripts/test-broker.sh; each line prefixed
# by its broker), side by side: the race-enabled tests; the Kubernetes
# manifest checks; the ones that disturb a whole node (memory alarm, broker
# restarts) one at a time on a standalone node of their own; the cluster
# tests on three more nodes (extra nodes stopped and deleted afterwards,
# pass or fail); beside them all, the release
# builder's tests (make release-test); last, an account of what failed
# (scripts/testreport.go) and each broker's time per step.
# The clients target installs what the client tests run besides Go (Node's
# amqplib, pika, Qpid Proton).
test: prepare
	@logs=$$(mktemp -d); pids=; \
	( set -o pipefail; $(MAKE) --no-print-directory release-test 2>&1 | sed -u "s/^/[release] /" ) & pids="$$!"; \
	for b in $(BROKERS); do \
	  ( set -o pipefail; REBOUND_TEST_ACCOUNT=$$logs/$$b ./scripts/test-broker.sh $$b '$(CHAOS_TESTS)' '$(CLUSTER_TESTS)' $(GO_TEST_FLAGS) 2>&1 | sed -u "s/^/[$$b] /" ) & \
	  pids="$$pids $$!"; \
	done; failed=0; for p in $$pids; do wait $$p || failed=1; done; \
	if [ $$failed = 1 ]; then cat $$logs/*; fi; rm -rf $$logs; exit $$failed

# What both chains need, in two lanes at once. One installs: the brokers,
# the clients and promtool (downloads and package installs, which share
# apt's lock, so one after the other), then builds Helm (tools/go.mod) for
# deploy/validate. The other checks (lint) and compiles every test binary
# with -race, so that the chains' six go test runs do not each compile the
# same packages at once when they start. On a fresh machine the steps one
# after the other took brokers 60 s, clients 60 s, lint 186 s, Helm 205 s.
prepare:
	@( set -o pipefail; $(MAKE) --no-print-directory brokers clients alerts helm 2>&1 | sed -u "s/^/[install] /" ) & installing=$$!; \
	$(MAKE) --no-print-directory lint test-binaries; checked=$$?; \
	wait $$installing && exit $$checked

helm:
	@cd tools && go tool helm version > /dev/null

# Compiles (and does not run: -exec true) the test binaries make test runs.
test-binaries:
	go test $(GO_TEST_FLAGS) -exec true ./... > /dev/null
	go test $(GO_TEST_FLAGS) -tags chaos -exec true ./e2e/ > /dev/null

# The alerting rules, checked and unit-tested by promtool (every alert,
# firing and silent); scripts/ensure-promtool.sh takes promtool from
# Debian's prometheus package when it is missing.
alerts:
	@./scripts/ensure-promtool.sh
	promtool check rules deploy/prometheus/rebound-alerts.yaml
	promtool test rules deploy/prometheus/rebound-alerts.test.yaml

build:
	@./scripts/ensure-go.sh
	CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/rebound-mq/rebound/internal/buildinfo.version=$(VERSION) -X github.com/rebound-mq/rebound/internal/buildinfo.revision=$(REVISION)" -o bin/rebound .

# The release artifacts of the tree as it is, into dist/VERSION
# (tools/release: both binaries, the two-architecture OCI image, the SBOM,
# SHA256SUMS). The same tree gives the same bytes.
dist:
	@./scripts/ensure-go.sh
	cd tools && go run ./release -repo .. -out ../dist/$(VERSION) -version $(VERSION) -revision $(REVISION)

# Cuts VERSION from the CHANGELOG's [Unreleased], commits and tags it, then
# builds its artifacts (make dist). Refuses a dirty tree, a version the
# CHANGELOG or a tag already has, and an empty [Unreleased].
release:
	./scripts/release.sh

# The tools module's checks (tidy, vet, staticcheck; actionlint on the
# workflows) and the release builder's tests: the image's config, its own
# binary run from its unpacked files, the SBOM, two builds giving the same
# digest, and make release's refusals. make test runs it beside the broker
# chains, off their critical path. -timeout 30m: beside the chains on a
# slow machine, its four cross-builds took past go test's default 10m.
release-test:
	@./scripts/ensure-go.sh
	cd tools && go mod tidy -diff && go vet ./... && go run $(STATICCHECK) ./...
	cd tools && go tool actionlint ../.github/workflows/*.yml
	cd tools && go test -count=1 -timeout 30m ./...
	bash scripts/release_test.sh

lint:
	@./scripts/ensure-go.sh
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	go mod tidy -diff
	go vet ./...
	go vet -tags chaos ./e2e/
	go run $(STATICCHECK) ./...
	bash scripts/rabbitmq43_test.sh
	go run $(STATICCHECK) -tags chaos ./e2e/

# The broker the demo and `make run` use: RabbitMQ 3.10 on 127.0.0.1:5672.
broker:
	@./scripts/ensure-rabbitmq.sh

# Both brokers of the test matrix.
brokers: broker
	@./scripts/rabbitmq43.sh ensure

# The clients docs/consumers.md's snippets and the AMQP 1.0 test run:
# Node with npm's amqplib and rhea (in docs/consumers/node_modules), Debian's
# python3-pika and python3-qpid-proton.
clients:
	@./scripts/ensure-clients.sh

# rebound against RabbitMQ's Shovel and a bare amqp091-go relay on both
# brokers (4.3, then 3.10), pinned and unpinned, with the CPU each spends
# per message, the delay spread and delay accuracy; rewrites
# docs/BENCHMARKS.md. (What e2e asserts, storms, large messages and
# replicas, is measured there.)
bench: brokers
	go run ./cmd/bench

# Fault injection with message accounting on both brokers (kill -9, broker
# restarts, closed connections, memory alarm, deleted delay queue; classic
# and quorum), printed as the tables of RELIABILITY.md.
chaos: brokers
	./scripts/chaos.sh

# The flake hunt: every broker-facing test, six times per broker (half of
# the runs with every core busy and a second copy of the suite sharing the
# broker), nothing retried; a summary names each failing test. Run it
# before relying on a new broker test. FLAKE_RUNS=N for more or fewer.
FLAKE_RUNS ?= 6
flaketest: brokers clients
	./scripts/flaketest.sh -n $(FLAKE_RUNS)

# The plots of README.md's "Simulating a policy", from the default policy
# and seed 1 (deterministic). The environment is emptied of REBOUND_*
# variables so that the committed plots do not depend on the shell.
SIMULATE := env -i PATH="$(PATH)" HOME="$(HOME)" go run . simulate
TEXT_EB := text-eb: REBOUND_MIN_DELAY=100ms REBOUND_MULTIPLIER=2.7 REBOUND_JITTER=gaussian REBOUND_JITTER_FACTOR=0.1 REBOUND_MAX_DELAY=5m REBOUND_MAX_RETRIES=0
plots:
	@./scripts/ensure-go.sh
	$(SIMULATE) burst --svg docs/simulate-burst.svg
	$(SIMULATE) outage --compare '$(TEXT_EB)' --svg docs/simulate-outage.svg
	$(SIMULATE) outage --rate 200 --strategies policy --compare 'cap100: REBOUND_RETRY_RATE=100' --svg docs/simulate-outage-cap.svg
