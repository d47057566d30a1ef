package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sentiment models that `playwatch sentiment adapt` kept (schema.sql
// migration 14, docs/sentiment.md §10): every sentiment job uses the newest,
// the embedded model while there is none.

// sentimentModelCheckEvery is how often a running job looks for a newer
// model in the database.
const sentimentModelCheckEvery = time.Minute

// newestSentimentModelVersion is the version of the newest stored model
// adapted from this binary's embedded model, "" without one: after an
// upgrade brings a new embedded model (or lexicon), the models adapted from
// the old one are left alone until adapt runs again.
func newestSentimentModelVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (string, error) {
	var v string
	err := q.QueryRow(ctx, `SELECT version FROM sentiment_models WHERE figures->>'base' = $1
		ORDER BY created_at DESC, version DESC LIMIT 1`, sentimentModelVersion(sentimentModelFile)).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("newest sentiment model: %w", err)
	}
	return v, nil
}

// loadStoredSentimentModel decodes the stored model of that version.
func loadStoredSentimentModel(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, version string) (*sentimentModel, error) {
	var b []byte
	if err := q.QueryRow(ctx, `SELECT bytes FROM sentiment_models WHERE version = $1`, version).Scan(&b); err != nil {
		return nil, fmt.Errorf("sentiment model %s: %w", version, err)
	}
	m, err := sentimentModelOf(b)
	if err != nil {
		return nil, fmt.Errorf("sentiment model %s: %w", version, err)
	}
	if m.Version() != version {
		return nil, fmt.Errorf("sentiment model %s: its bytes are version %s (another lexicon?)", version, m.Version())
	}
	return m, nil
}

// currentSentimentModel is the model a job uses now: the newest stored one,
// else the embedded one.
func currentSentimentModel(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (*sentimentModel, error) {
	v, err := newestSentimentModelVersion(ctx, q)
	if err != nil {
		return nil, err
	}
	if v == "" {
		return loadSentimentModel()
	}
	return loadStoredSentimentModel(ctx, q, v)
}

// storeSentimentModel keeps an adapted model with adapt's figures.
func storeSentimentModel(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, file []byte, figures any) (string, error) {
	fig, err := json.Marshal(figures)
	if err != nil {
		return "", err
	}
	v := sentimentModelVersion(file)
	var created time.Time
	if err := q.QueryRow(ctx, `INSERT INTO sentiment_models (version, bytes, figures) VALUES ($1, $2, $3)
		ON CONFLICT (version) DO UPDATE SET figures = EXCLUDED.figures, created_at = now() RETURNING created_at`, v, file, fig).Scan(&created); err != nil {
		return "", fmt.Errorf("store sentiment model: %w", err)
	}
	return v, nil
}

// refreshModel switches the job to the newest stored model, looking at
// most every sentimentModelCheckEvery; trouble keeps the model it has.
func (j *sentimentJob) refreshModel(ctx context.Context) {
	if !j.watchModels {
		return
	}
	now := j.clock.Now()
	if !j.modelCheckedAt.IsZero() && now.Sub(j.modelCheckedAt) < sentimentModelCheckEvery {
		return
	}
	j.modelCheckedAt = now
	v, err := newestSentimentModelVersion(ctx, j.pool)
	if err != nil || v == "" || v == j.version {
		if err != nil && ctx.Err() == nil {
			j.logger.Warn("sentiment job cannot look for a newer model; it keeps its own", "model", j.version, "err", err)
		}
		return
	}
	m, err := loadStoredSentimentModel(ctx, j.pool, v)
	if err != nil {
		j.logger.Error("sentiment job cannot load the newest model; it keeps its own", "model", j.version, "newest", v, "err", err)
		return
	}
	j.logger.Info("sentiment job switches model", "from", j.version, "to", v)
	j.setModel(m)
}

// setModel makes the job label with m from its next batch on.
func (j *sentimentJob) setModel(m sentimentClassifier) {
	j.model, j.version = m, m.Version()
	j.failed = failedModelPrefix + j.version
	j.failed = j.failed[:min(len(j.failed), 40)] // sentiment_model is VARCHAR(40)
}

// databaseSentimentModel is `classify --model db`'s model: the newest
// stored one (the embedded one while there is none), from the database of
// DATABASE_URL or of the playwatch on the data directory.
func databaseSentimentModel(ctx context.Context, getenv func(string) string, stderr io.Writer) (*sentimentModel, error) {
	cl, err := parseCommandLine("sentiment classify", "sentiment classify --model db", nil, getenv, io.Discard, stderr, nil)
	if err != nil {
		return nil, err
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return nil, err
	}
	m, err := currentSentimentModel(ctx, be.pool)
	if err == nil {
		fmt.Fprintf(stderr, "sentiment model %s (from the database)\n", m.Version())
	}
	return m, errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}
