package main

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metricMaker makes a metric and registers it on reg in one call, so that a
// role's metrics read one line each: name, help, then buckets or labels.
// A nil reg makes them unregistered, for a caller that registers them
// itself (through a collector of its own, or to return a clash as an error).
type metricMaker struct{ reg prometheus.Registerer }

func (f metricMaker) counter(name, help string) prometheus.Counter {
	return promauto.With(f.reg).NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func (f metricMaker) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return promauto.With(f.reg).NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func (f metricMaker) gauge(name, help string) prometheus.Gauge {
	return promauto.With(f.reg).NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func (f metricMaker) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return promauto.With(f.reg).NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func (f metricMaker) histogram(name, help string, buckets []float64) prometheus.Histogram {
	return promauto.With(f.reg).NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

func (f metricMaker) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return promauto.With(f.reg).NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}
