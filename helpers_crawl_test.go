package main

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// newProduceOutageFixture is a crawl fixture with workers workers and three
// registered apps (com.example.app0 to app2, 150 reviews each) whose broker
// rejects every produce until the returned fault is removed.
func newProduceOutageFixture(t *testing.T, workers int) (*crawlFixture, *kfake.FaultHandle) {
	t.Helper()
	f := newCrawlFixture(t, testCrawlerConfig(workers, 150), nil)
	for i := range 3 {
		f.register(t, fmt.Sprintf("com.example.app%d", i), false)
	}
	return f, f.broker.cluster.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotEnoughReplicas, Count: -1})
}
