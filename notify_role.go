package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// newNotifierRole is the notifier role of `run` and `notify run`: the event
// decider (notify_events.go), which puts events into the outbox, and the
// delivery workers (notify_delivery.go), which send them. Both run until
// ctx ends; the role ends when both have.
func newNotifierRole(pool *pgxpool.Pool, cfg Config, reg prometheus.Registerer, logger *slog.Logger) (func(context.Context) error, error) {
	sender, err := newNotifySender(notifySenderConfigOf(cfg), logger)
	if err != nil {
		return nil, fmt.Errorf("notifier: %w", err)
	}
	decider := newNotifyDecider(pool, notifyDeciderConfigOf(cfg), reg, logger)
	delivery := newNotifyDelivery(pool, sender, notifyDeliveryConfigOf(cfg), reg, logger)
	return func(ctx context.Context) error {
		// One failing ends the other too: the role is down and says why.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var wg sync.WaitGroup
		var decideErr, deliverErr error
		wg.Go(func() {
			if decideErr = decider.Run(ctx); decideErr != nil {
				decideErr = fmt.Errorf("event decider: %w", decideErr)
				cancel()
			}
		})
		wg.Go(func() {
			if deliverErr = delivery.Run(ctx); deliverErr != nil {
				deliverErr = fmt.Errorf("delivery: %w", deliverErr)
				cancel()
			}
		})
		wg.Wait()
		if decideErr != nil {
			return decideErr
		}
		return deliverErr
	}, nil
}
