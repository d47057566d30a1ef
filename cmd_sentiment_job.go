package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
)

// `playwatch sentiment run` and `playwatch sentiment rescore`: the
// sentiment job alone, and marking reviews for it to score again
// (sentiment_job.go). Both use the database of the playwatch that runs on
// the data directory, or DATABASE_URL.

// cmdSentimentRun runs the sentiment role alone until a signal. Its
// metrics are not served: `run --roles sentiment` serves them.
func cmdSentimentRun(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseNoArgs("sentiment run", "sentiment run [flags]", args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	model, err := loadSentimentModel()
	if err != nil {
		return fmt.Errorf("sentiment model: %w", err)
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
		job := newSentimentJob(be.pool, model, sentimentJobConfigOf(cl.cfg), prometheus.NewRegistry(), cl.logger)
		job.watchModels = true
		return job.Run(ctx)
	})
}

// cmdSentimentRescore marks reviews for re-scoring, a batch per
// transaction with its progress on stderr, and prints how many.
func cmdSentimentRescore(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var all, older bool
	cl, err := parseNoArgs("sentiment rescore", "sentiment rescore --all|--model-older [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&all, "all", false, "mark every scored review")
		fs.BoolVar(&older, "model-older", false, "mark the reviews another model version scored")
	})
	if err != nil {
		return err
	}
	if all == older {
		return usageError{"sentiment rescore needs exactly one of --all and --model-older"}
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
		// The model the jobs use: the newest sentiment adapt kept, else the embedded one.
		model, err := currentSentimentModel(ctx, be.pool)
		if err != nil {
			return fmt.Errorf("sentiment model: %w", err)
		}
		n, err := rescoreSentiment(ctx, be.pool, all, model.Version(), sentimentRescoreBatch, func(marked, total int64) {
			fmt.Fprintf(stderr, "marked %d of %d reviews\n", marked, total)
		})
		if err != nil {
			return err
		}
		backlog, err := sentimentBacklog(ctx, be.pool)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d reviews marked for re-scoring (model %s); backlog now %d: the sentiment role scores them\n", n, model.Version(), backlog)
		return nil
	})
}
