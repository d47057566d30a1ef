# playwatch: `make run` builds and runs the appliance, `make test` runs every test.
GO       ?= go
VERSION  := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
FUZZTIME ?= 30s

.PHONY: build run demo test test-api test-faults kafka-jars live bench bench-fleet fuzz vet cross clean train-sentiment eval-sentiment

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o playwatch .

run: build
	./playwatch run

# The offline demo (demo_test.go): the appliance in a temporary directory
# against a replay Play Store built from testdata; prints what landed in
# PostgreSQL and ends with the URL of the status page, which stays up until
# Ctrl-C (or SIGTERM) when make runs in a terminal or PLAYWATCH_DEMO_WAIT=1.
# PLAYWATCH_HTTP_ADDR and PLAYWATCH_BROKER_ADDR are honoured. Local
# directory mode (no package argument) streams its output; exec makes go
# test make's child, so that a SIGTERM make forwards reaches it.
demo:
	PLAYWATCH_DEMO=1 PLAYWATCH_DEMO_WAIT=$${PLAYWATCH_DEMO_WAIT-$$([ -t 0 ] && echo 1)} exec $(GO) test -timeout 0 -run '^TestDemo$$'

# Most tests wait (on servers starting, timeouts, child processes) more
# than they compute: the ones marked t.Parallel() run TEST_PARALLEL at once.
# 8 at once left timing-bound tests (an appliance getting ready, a cycle
# within 30 s) failing now and then on 2 cores; 4 costs about a minute.
TEST_PARALLEL ?= 4
test: vet
	@scripts/kafka.sh check || true
	@if command -v amtool >/dev/null; then amtool check-config deploy/alertmanager/alertmanager.yml; \
	elif [ "$$CI" = true ]; then echo "amtool is required under CI=true (Debian: prometheus-alertmanager)"; exit 1; \
	else echo "amtool not found (Debian: prometheus-alertmanager): deploy/alertmanager/alertmanager.yml not checked"; fi
	$(GO) test -count=1 -parallel $(TEST_PARALLEL) -timeout 15m ./...

# schemathesis (in a venv under .cache/schemathesis) fuzzes the registry API
# of a running appliance against api/openapi.json; scripts/test_api.sh says
# how. Skipped where it cannot be installed, except with CI=true.
test-api:
	GO=$(GO) scripts/test_api.sh

# The slow fault suite (fault_*_test.go): a three-node Apache Kafka cluster
# losing a leader mid-cycle, outages of the broker and of PostgreSQL, the
# appliance killed mid-cycle, a throttling Play Store with a dead proxy.
test-faults: kafka-jars
	PLAYWATCH_FAULT_TESTS=1 $(GO) test -count=1 -v -timeout 60m -run 'ThreeNode|Fault' ./...

# The live canary: two real apps from the real Play Store, to catch a format
# change at Google the day it happens. Never part of `make test`.
live:
	$(GO) test -count=1 -tags live -run Live -v .

# Apache Kafka jars from Maven Central (testdata/kafka/pom.xml) for the
# real-engine tests, into .cache/kafka/libs.
kafka-jars:
	scripts/kafka.sh fetch

# deadcode (pinned) lists functions that no path from main reaches: code only
# tests call is deleted, not kept for them.
# gofmt must print nothing; staticcheck (pinned; staticcheck.conf turns off
# ST1018 only, for the ZWNJ of Persian string literals) must pass.
# The four checks run at once, each printing when it is done; each pinned tool
# is built once, into .cache/bin/NAME@VERSION/.
DEADCODE ?= golang.org/x/tools/cmd/deadcode@v0.52.0
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
tool_bin = .cache/bin/$(notdir $(1))/$(notdir $(firstword $(subst @, ,$(1))))
DEADCODE_BIN := $(call tool_bin,$(DEADCODE))
STATICCHECK_BIN := $(call tool_bin,$(STATICCHECK))
vet: $(STATICCHECK_BIN) $(DEADCODE_BIN)
	@$(MAKE) --no-print-directory -j4 --output-sync=target vet-go vet-gofmt vet-staticcheck vet-deadcode

$(DEADCODE_BIN):
	GOBIN=$(abspath $(@D)) $(GO) install $(DEADCODE)
$(STATICCHECK_BIN):
	GOBIN=$(abspath $(@D)) $(GO) install $(STATICCHECK)

.PHONY: vet-go vet-gofmt vet-staticcheck vet-deadcode
vet-go:
	$(GO) vet ./...
vet-gofmt:
	@out=$$(find . -name '*.go' -not -path './.cache/*' -exec gofmt -l {} +) || exit 1; \
	if [ -n "$$out" ]; then echo "$$out"; echo "gofmt: these files are not formatted; run gofmt -w"; exit 1; fi
vet-staticcheck:
	$(STATICCHECK_BIN) ./...
vet-deadcode:
	@out=$$($(DEADCODE_BIN) ./...) || exit 1; \
	if [ -n "$$out" ]; then echo "$$out"; echo "deadcode: these functions are unreachable from main; delete them"; exit 1; fi

# The sentiment model (docs/sentiment.md §3): the trainer downloads its data
# into .cache/sentiment and rewrites sentiment_model.bin.gz, byte for byte
# the same from the same inputs.
train-sentiment:
	PLAYWATCH_TRAIN_SENTIMENT=1 $(GO) test -count=1 -run '^TestTrainSentiment$$' -v .

# Quality of the sentiment labels on every evaluation set, in one run
# (docs/sentiment.md §5). SENTIFARS is a Persian hotel-review set that is
# not part of the repository: `make eval-sentiment SENTIFARS=path/to.tsv`;
# without it that set is skipped.
SENTIFARS ?=
eval-sentiment:
	PLAYWATCH_EVAL_SENTIMENT=1 SENTIFARS="$(SENTIFARS)" $(GO) test -count=1 -run '^(TestEvalSentiment|TestTopicQuality)$$' -v .

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 60m ./...

# The fleet benchmark (README "Fleet benchmark"): three servers, Apache
# Kafka, PostgreSQL, 500 proxies and 35,000 apps for 15 minutes; report and
# chart in .cache/bench-fleet/. Not part of `make test` or CI. A short run:
# make bench-fleet BENCH_FLEET_DURATION=2m BENCH_FLEET_APPS=2000 BENCH_FLEET_INTERVAL=40s
bench-fleet: kafka-jars
	PLAYWATCH_BENCH_FLEET=1 $(GO) test -count=1 -v -timeout 0 -run '^TestBenchFleet$$' .

# Runs every fuzz target for FUZZTIME each; new crashers land in testdata/fuzz.
fuzz:
	@for f in $$($(GO) test -list '^Fuzz' . | grep '^Fuzz'); do \
		echo "== $$f"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) . || exit 1; \
	done

# Builds and vets the binary for other systems, so a Linux-only call without
# a build tag fails here and not on a developer's Mac.
CROSS_TARGETS ?= darwin/arm64 darwin/amd64 freebsd/amd64 linux/arm64
cross:
	@for t in $(CROSS_TARGETS); do \
		echo "== $$t"; \
		GOOS=$${t%/*} GOARCH=$${t#*/} $(GO) build -o /dev/null . || exit 1; \
		GOOS=$${t%/*} GOARCH=$${t#*/} $(GO) vet ./... || exit 1; \
	done

clean:
	rm -f playwatch
