# rebound: the two quick-start commands are `make run` and `make test`.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.7.0
GO_TEST_FLAGS ?= -race -count=1 -timeout 30m

.PHONY: run test build lint broker

# Runs rebound against the local broker, starting (or installing) RabbitMQ first.
run: broker build
	./bin/rebound schedule
	./bin/rebound run

# The whole test suite against a real RabbitMQ: formatting, vet, staticcheck, race tests.
test: broker lint
	go test $(GO_TEST_FLAGS) ./...

build:
	@./scripts/ensure-go.sh
	CGO_ENABLED=0 go build -trimpath -o bin/rebound .

lint:
	@./scripts/ensure-go.sh
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	go run $(STATICCHECK) ./...

broker:
	@./scripts/ensure-rabbitmq.sh
