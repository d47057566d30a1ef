package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

// producerSettings are the producer guarantees of the design, each from its
// own variable (see config.go).
type producerSettings struct {
	Acks            string // all, leader or none
	Idempotent      bool
	Retries         int           // retries inside the client
	RetryBackoff    time.Duration // between those retries
	RequestTimeout  time.Duration
	DeliveryTimeout time.Duration
	// AppRetryDelays are the waits before each application-level resend of
	// the records the client gave up on.
	AppRetryDelays []time.Duration
}

// producerOptions are the franz-go options for settings.
func producerOptions(s producerSettings) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.RecordRetries(s.Retries),
		kgo.RetryBackoffFn(func(int) time.Duration { return s.RetryBackoff }),
		// A retriable produce error waits for a metadata refresh, which is
		// at most one per MetadataMinAge (default 5s): without this the
		// client would try once or twice per delivery timeout, not Retries times.
		kgo.MetadataMinAge(s.RetryBackoff),
		kgo.ProduceRequestTimeout(s.RequestTimeout),
		kgo.RecordDeliveryTimeout(s.DeliveryTimeout),
	}
	switch s.Acks {
	case "all":
		opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
	case "leader":
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()))
	case "none":
		opts = append(opts, kgo.RequiredAcks(kgo.NoAck()))
	}
	if !s.Idempotent {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	return opts
}

// recordProducer is the part of *kgo.Client the publisher uses.
type recordProducer interface {
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
}

// publisher sends messages with per-record confirmation: a caller waits for
// the promises of its own records only, so a failure belongs to exactly one
// app and one path. Records the client gives up on are resent, alone, after
// each of the AppRetryDelays; after the last one the send fails closed.
type publisher struct {
	producer recordProducer
	delays   []time.Duration
	// confirmWait bounds the wait for the promises of one attempt. Within
	// it the client confirms a record or gives up on it, except a record it
	// sent without getting an answer (the broker went away) and the records
	// queued behind it: the idempotent client keeps those until a broker
	// answers, as giving up could let a resend duplicate them. They are
	// unconfirmed: not resent, and their send fails closed at once, so that
	// a broker outage does not stall the cycle.
	confirmWait time.Duration
	clock       clock // the waits before resends
	// gate, when set, holds a send back while the broker has no room for
	// it (the embedded broker's budget, broker_budget.go).
	gate    publishGate
	metrics *publishMetrics
	logger  *slog.Logger
}

// publishGate says why a topic has no room for more records now, or "" when
// it has.
type publishGate interface {
	full(ctx context.Context, topic string) (string, error)
}

// roomPollInterval is how often a send held back by the gate asks again.
const roomPollInterval = time.Second

func newPublisher(p recordProducer, s producerSettings, reg prometheus.Registerer, logger *slog.Logger) *publisher {
	return &publisher{producer: p, delays: s.AppRetryDelays, confirmWait: s.DeliveryTimeout + s.RequestTimeout,
		clock: systemClock{}, metrics: newPublishMetrics(reg), logger: logger}
}

// errUnconfirmed is the last error of a send that has unconfirmed records.
var errUnconfirmed = errors.New("no answer from the broker within KAFKA_DELIVERY_TIMEOUT + KAFKA_REQUEST_TIMEOUT; " +
	"the client keeps the records and delivers them once a broker answers, so they are not resent")

// publishError says how many records of a send were not confirmed after
// every retry, and why the last one failed.
type publishError struct {
	Topic     string
	Failed    int
	Total     int
	Attempts  int
	LastError error
}

func (e *publishError) Error() string {
	return fmt.Sprintf("publish to %s: %d of %d records not confirmed after %d attempts: %v", e.Topic, e.Failed, e.Total, e.Attempts, e.LastError)
}

func (e *publishError) Unwrap() error { return e.LastError }

// PublishAppStats sends one app-stats message.
func (p *publisher) PublishAppStats(ctx context.Context, m appStatsMessage) error {
	return p.publishJSON(ctx, topicAppStats, m.PackageName, m)
}

// PublishReviews sends one message per review of one app: the whole batch
// is enqueued first, then only the residual is resent.
func (p *publisher) PublishReviews(ctx context.Context, pkg string, ms []reviewMessage) error {
	key := []byte(pkg)
	recs := make([]*kgo.Record, len(ms))
	for i := range ms {
		b, err := ms[i].encodeJSON()
		if err != nil {
			return fmt.Errorf("encode %s message for %s: %w", topicReviews, pkg, err)
		}
		recs[i] = &kgo.Record{Topic: topicReviews, Key: key, Value: b}
	}
	return p.send(ctx, topicReviews, recs)
}

// PublishNetworkMetrics sends the analysis of one capture.
func (p *publisher) PublishNetworkMetrics(ctx context.Context, m networkMetricsMessage) error {
	return p.publishJSON(ctx, topicNetworkMetrics, m.PackageName, m)
}

func (p *publisher) publishJSON(ctx context.Context, topic, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s message for %s: %w", topic, key, err)
	}
	return p.send(ctx, topic, []*kgo.Record{{Topic: topic, Key: []byte(key), Value: b}})
}

// send produces recs and waits for each one's confirmation, resending the
// unconfirmed ones after each delay. ctx only cuts a wait between attempts
// short: records handed to the client are never cancelled, because franz-go
// fails a whole buffered batch (other apps' records too) when the context of
// its first record ends.
func (p *publisher) send(ctx context.Context, topic string, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil // nothing would ever confirm, and the wait would last its whole bound
	}
	total := len(recs)
	if err := p.waitForRoom(ctx, topic); err != nil {
		return &publishError{Topic: topic, Failed: total, Total: total, LastError: err}
	}
	pending := recs
	for attempt := 0; ; attempt++ {
		failed, unconfirmed, lastErr := p.produceAndWait(context.WithoutCancel(ctx), pending)
		p.metrics.produced.WithLabelValues(topic).Add(float64(len(pending) - len(failed) - unconfirmed))
		if len(failed) == 0 && unconfirmed == 0 {
			return nil
		}
		p.metrics.failed.WithLabelValues(topic).Add(float64(len(failed)))
		if unconfirmed > 0 {
			p.metrics.failedClosed.WithLabelValues(topic).Inc()
			return &publishError{Topic: topic, Failed: len(failed) + unconfirmed, Total: total, Attempts: attempt + 1,
				LastError: errors.Join(lastErr, fmt.Errorf("%d records unconfirmed: %w", unconfirmed, errUnconfirmed))}
		}
		if attempt == len(p.delays) {
			p.metrics.failedClosed.WithLabelValues(topic).Inc()
			return &publishError{Topic: topic, Failed: len(failed), Total: total, Attempts: attempt + 1, LastError: lastErr}
		}
		p.logger.Warn("records not confirmed; resending the residual", "topic", topic,
			"key", string(failed[0].Key), "residual", len(failed), "of", total, "retry_in", p.delays[attempt], "err", lastErr)
		if err := sleepOn(ctx, p.clock, p.delays[attempt]); err != nil {
			return &publishError{Topic: topic, Failed: len(failed), Total: total, Attempts: attempt + 1, LastError: errors.Join(lastErr, err)}
		}
		p.metrics.residualRetries.WithLabelValues(topic).Inc()
		pending = make([]*kgo.Record, len(failed))
		for i, r := range failed {
			pending[i] = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value}
		}
	}
}

// waitForRoom waits until the gate lets topic take more records, or ctx
// ends. A gate that cannot tell lets the send through: the broker still
// deletes nothing the storage consumer has not stored.
func (p *publisher) waitForRoom(ctx context.Context, topic string) error {
	if p.gate == nil {
		return nil
	}
	var since time.Time
	for {
		why, err := p.gate.full(ctx, topic)
		if err != nil {
			p.logger.Warn("cannot tell whether the broker has room; publishing", "topic", topic, "err", err)
			return nil
		}
		if why == "" {
			if !since.IsZero() {
				p.logger.Info("the broker has room again; publishing", "topic", topic, "waited", p.clock.Now().Sub(since).Round(time.Millisecond))
			}
			return nil
		}
		if since.IsZero() {
			since = p.clock.Now()
			p.metrics.backpressureWaits.WithLabelValues(topic).Inc()
			p.logger.Warn("waiting before publishing: "+why+"; the crawl goes on once the consumer has stored them", "topic", topic)
		}
		if err := sleepOn(ctx, p.clock, roomPollInterval); err != nil {
			return fmt.Errorf("waiting for room on the broker: %w", err)
		}
		p.metrics.backpressureSeconds.WithLabelValues(topic).Add(roomPollInterval.Seconds())
	}
}

// produceAndWait hands recs to the client and waits for every promise, at
// most confirmWait once the last record is handed over. It returns the
// records the client gave up on and how many promises did not come back.
func (p *publisher) produceAndWait(ctx context.Context, recs []*kgo.Record) (failed []*kgo.Record, unconfirmed int, lastErr error) {
	var (
		mu   sync.Mutex
		left = len(recs)
		done = make(chan struct{})
	)
	for _, r := range recs {
		p.producer.Produce(ctx, r, func(r *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, r)
				lastErr = err
			}
			if left--; left == 0 {
				close(done)
			}
		})
	}
	timer := time.NewTimer(p.confirmWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	}
	// Promises that come later must not touch what is returned.
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(failed), left, lastErr
}

type publishMetrics struct {
	produced            *prometheus.CounterVec
	failed              *prometheus.CounterVec
	residualRetries     *prometheus.CounterVec
	failedClosed        *prometheus.CounterVec
	backpressureWaits   *prometheus.CounterVec
	backpressureSeconds *prometheus.CounterVec
}

func newPublishMetrics(reg prometheus.Registerer) *publishMetrics {
	mk := metricMaker{reg}
	m := &publishMetrics{
		produced:            mk.counterVec("playwatch_publish_messages_produced_total", "Messages the broker confirmed, by topic.", "topic"),
		failed:              mk.counterVec("playwatch_publish_messages_failed_total", "Produce attempts of a message that the client gave up on, by topic (a resent message counts once per failed attempt).", "topic"),
		residualRetries:     mk.counterVec("playwatch_publish_residual_retries_total", "Application-level resends of the unconfirmed records of a send, by topic.", "topic"),
		failedClosed:        mk.counterVec("playwatch_publish_failed_closed_total", "Sends given up after every retry (that path of that app is skipped this cycle), by topic.", "topic"),
		backpressureWaits:   mk.counterVec("playwatch_publish_backpressure_waits_total", "Sends held back because records the storage consumer has not stored fill the embedded broker's share for the topic, by topic.", "topic"),
		backpressureSeconds: mk.counterVec("playwatch_publish_backpressure_seconds_total", "Time sends spent held back for room on the embedded broker, by topic.", "topic"),
	}
	for _, t := range allTopics {
		m.produced.WithLabelValues(t)
		m.failed.WithLabelValues(t)
		m.residualRetries.WithLabelValues(t)
		m.failedClosed.WithLabelValues(t)
		m.backpressureWaits.WithLabelValues(t)
		m.backpressureSeconds.WithLabelValues(t)
	}
	return m
}
