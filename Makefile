# playwatch: `make run` builds and runs the appliance, `make test` runs every test.
GO       ?= go
VERSION  := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)
FUZZTIME ?= 30s

.PHONY: build run test bench fuzz vet clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o playwatch .

run: build
	./playwatch run

test: vet
	$(GO) test -count=1 -timeout 15m ./...

vet:
	$(GO) vet ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 60m ./...

# Runs every fuzz target for FUZZTIME each; new crashers land in testdata/fuzz.
fuzz:
	@for f in $$($(GO) test -list '^Fuzz' . | grep '^Fuzz'); do \
		echo "== $$f"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) . || exit 1; \
	done

clean:
	rm -f playwatch
