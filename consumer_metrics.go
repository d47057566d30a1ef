package main

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// consumerMetrics are the storage consumer's Prometheus metrics, plus the
// newest stored times behind the freshness computed at scrape time.
type consumerMetrics struct {
	records      *prometheus.CounterVec
	rows         *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	dbErrors     *prometheus.CounterVec
	batchRecords prometheus.Histogram
	writeSeconds prometheus.Histogram
	lag          *prometheus.GaugeVec
	paused       prometheus.Gauge
	blockedTotal prometheus.Counter
	offsetResets *prometheus.CounterVec

	mu     sync.Mutex
	newest map[string]time.Time // newest stored crawled_at/analyzed_at by topic
}

func newConsumerMetrics(reg prometheus.Registerer) *consumerMetrics {
	m := &consumerMetrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "playwatch_consumer_records_total",
			Help: "Kafka records the storage consumer polled, by topic.",
		}, []string{"topic"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "playwatch_consumer_rows_written_total",
			Help: "Rows the storage consumer inserted or updated, by table (apps_registry_application: names filled in).",
		}, []string{"table"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "playwatch_consumer_dead_letters_total",
			Help: "Records found dead (a dead_letter_events row, or one that already existed for that offset), by reason code.",
		}, []string{"reason"}),
		dbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "playwatch_consumer_db_errors_total",
			Help: "Failed batch transactions, by kind: transient and blocked are retried, data is narrowed to the refused rows.",
		}, []string{"kind"}),
		batchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "playwatch_consumer_batch_records",
			Help:    "Records per batch transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "playwatch_consumer_batch_write_seconds",
			Help:    "Time of the successful attempt at a batch transaction, from BEGIN to COMMIT.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "playwatch_consumer_lag_records",
			Help: "Records in the partition after the last stored one, at the last fetch.",
		}, []string{"topic", "partition"}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "playwatch_consumer_paused",
			Help: "1 while the consumer has paused fetching because the database cannot take its batch.",
		}),
		blockedTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "playwatch_consumer_db_blocked_seconds_total",
			Help: "Time the consumer spent waiting for the database to take a batch (retrying transient errors).",
		}),
		offsetResets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "playwatch_consumer_offset_resets_total",
			Help: "Times a partition's stored offset was of a log the broker no longer has (beyond its log end, or no commit of the group for any partition of the topic: broker data deleted, or a new cluster) and was moved back to store the partition from the log start.",
		}, []string{"topic", "partition"}),
		newest: map[string]time.Time{},
	}
	for _, t := range allTopics {
		m.records.WithLabelValues(t)
	}
	for _, c := range contracts {
		m.rows.WithLabelValues(c.tableName())
	}
	m.rows.WithLabelValues(tableDeadLetters)
	m.rows.WithLabelValues(tableRegistry)
	m.rows.WithLabelValues(tableReviewStorefronts)
	for _, r := range allReasonCodes {
		m.deadLetters.WithLabelValues(string(r))
	}
	for k := range dbBlocked + 1 {
		m.dbErrors.WithLabelValues(k.String())
	}
	reg.MustRegister(m.records, m.rows, m.deadLetters, m.dbErrors, m.batchRecords, m.writeSeconds, m.lag, m.paused, m.blockedTotal, m.offsetResets,
		freshnessCollector{m},
	)
	return m
}

func (m *consumerMetrics) stored(out storeOutcome, newest map[string]time.Time) {
	for table, n := range out.rows {
		m.rows.WithLabelValues(table).Add(float64(n))
	}
	for _, d := range out.dead {
		m.deadLetters.WithLabelValues(string(d.code)).Inc()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for topic, t := range newest {
		if t.After(m.newest[topic]) {
			m.newest[topic] = t
		}
	}
}

// blocked counts d as time spent waiting for the database.
func (m *consumerMetrics) blocked(d time.Duration) { m.blockedTotal.Add(d.Seconds()) }

func (m *consumerMetrics) setLag(tp topicPartition, lag int64) {
	m.lag.WithLabelValues(tp.topic, strconv.Itoa(int(tp.partition))).Set(float64(max(lag, 0)))
}

func (m *consumerMetrics) forgetPartitions(ps map[string][]int32) {
	for topic, parts := range ps {
		for _, p := range parts {
			m.lag.DeleteLabelValues(topic, strconv.Itoa(int(p)))
		}
	}
}

// freshnessCollector reports, per topic, how old the newest stored record is.
type freshnessCollector struct{ m *consumerMetrics }

var freshnessDesc = prometheus.NewDesc("playwatch_consumer_data_freshness_seconds",
	"Now minus the crawled_at (analyzed_at for network-metrics) of the newest record stored since start, by topic.",
	[]string{"topic"}, nil)

func (c freshnessCollector) Describe(ch chan<- *prometheus.Desc) { ch <- freshnessDesc }

func (c freshnessCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for topic, t := range c.m.newest {
		ch <- prometheus.MustNewConstMetric(freshnessDesc, prometheus.GaugeValue, time.Since(t).Seconds(), topic)
	}
}
