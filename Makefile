# rebound. Quick start: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.7.0
GO_TEST_FLAGS ?= -race -count=1 -timeout 30m
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

.PHONY: demo run test build lint broker bench chaos plots

# The demo: rebound plus an application that fails every message.
demo: broker build
	./scripts/demo.sh

# Runs rebound alone against the local broker, in the foreground.
run: broker build
	./bin/rebound run

# The whole test suite against a real RabbitMQ: formatting, vet,
# staticcheck, race-enabled tests, the cluster test on three extra nodes
# (stopped and deleted afterwards, pass or fail), and the Kubernetes
# manifest checks.
test: broker lint
	go test $(GO_TEST_FLAGS) ./...
	REBOUND_TEST_BROKER_RESTART=1 go test $(GO_TEST_FLAGS) -run 'TestNoLossWhenBrokerRestarts' .
	trap './scripts/cluster.sh stop' EXIT; ./scripts/cluster.sh start && \
	  REBOUND_TEST_CLUSTER=amqp://guest:guest@127.0.0.1:5701/,amqp://guest:guest@127.0.0.1:5702/,amqp://guest:guest@127.0.0.1:5703/ \
	  go test $(GO_TEST_FLAGS) -run '^TestClusterNodeStopped$$' .
	@if [ -f deploy/validate/go.mod ]; then cd deploy/validate && go vet ./... && go test -count=1 ./...; fi

build:
	@./scripts/ensure-go.sh
	CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$(VERSION)" -o bin/rebound .

lint:
	@./scripts/ensure-go.sh
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	go run $(STATICCHECK) ./...

broker:
	@./scripts/ensure-rabbitmq.sh

# Throughput against RabbitMQ's Shovel and a naive consumer; rewrites BENCHMARKS.md.
bench: broker
	go run ./bench -backlog 1000000

# Fault injection with message accounting (kill -9, broker restarts, closed
# connections, memory alarm, deleted delay queue; classic and quorum).
chaos: broker
	./scripts/chaos.sh

# The plots of README.md's "Simulating a policy", from the default policy
# and seed 1 (deterministic). The environment is emptied of REBOUND_*
# variables so that the committed plots do not depend on the shell.
SIMULATE := env -i PATH="$(PATH)" HOME="$(HOME)" go run . simulate
TEXT_EB := text-eb: REBOUND_MIN_DELAY=100ms REBOUND_MULTIPLIER=2.7 REBOUND_JITTER=gaussian REBOUND_JITTER_FACTOR=0.1 REBOUND_MAX_DELAY=5m REBOUND_MAX_RETRIES=0
plots:
	@./scripts/ensure-go.sh
	$(SIMULATE) burst -svg docs/simulate-burst.svg
	$(SIMULATE) outage -compare '$(TEXT_EB)' -svg docs/simulate-outage.svg
