package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// newNotifierRole is the notifier role of `run` and `notify run`: the
// delivery workers of the outbox (notify_delivery.go).
func newNotifierRole(pool *pgxpool.Pool, cfg Config, reg prometheus.Registerer, logger *slog.Logger) (func(context.Context) error, error) {
	sender, err := newNotifySender(notifySenderConfigOf(cfg), logger)
	if err != nil {
		return nil, fmt.Errorf("notifier: %w", err)
	}
	delivery := newNotifyDelivery(pool, sender, notifyDeliveryConfigOf(cfg), reg, logger)
	return delivery.Run, nil
}
