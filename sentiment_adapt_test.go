package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// seedAdaptReviews stores reviews of apps with their stars, as the consumer
// would, items spread over the apps in turn.
func seedAdaptReviews(t *testing.T, pool *pgxpool.Pool, apps []string, items []sentItem) {
	t.Helper()
	for _, a := range apps {
		mustExec(t, pool, `INSERT INTO apps_registry_application (package_name) VALUES ($1) ON CONFLICT DO NOTHING`, a)
	}
	for i, it := range items {
		mustExec(t, pool, `INSERT INTO reviews (application_id, review_id, score, content, at, last_synced_at, first_seen_at)
			VALUES ((SELECT id FROM apps_registry_application WHERE package_name = $1), $2, $3, $4, now(), now(), now())`,
			apps[i%len(apps)], fmt.Sprintf("adapt-%d", i), it.Stars, it.Text)
	}
}

func storedSentimentModels(t *testing.T, pool *pgxpool.Pool) map[string]adaptFigures {
	t.Helper()
	out := map[string]adaptFigures{}
	var v string
	var raw []byte
	eachRow(t, pool, []any{&v, &raw}, func() {
		var f adaptFigures
		if err := json.Unmarshal(raw, &f); err != nil {
			t.Fatal(err)
		}
		out[v] = f
	}, `SELECT version, figures FROM sentiment_models`)
	return out
}

// TestSentimentAdaptKeepsABetterModelAndTheJobSwitches: reviews whose
// stars follow words the embedded model cannot know (an app's own jargon)
// give an adapted model that beats it on the held-out apps without losing
// on the dev sets; adapt keeps it, the job switches to it and labels with
// it, and rescore --model-older marks what the embedded model scored.
func TestSentimentAdaptKeepsABetterModelAndTheJobSwitches(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	words := [sentClasses][]string{
		{"zorbfail", "glimbroke", "snarfdead"},
		{"plonkmid", "meddlish", "so-so-ish"},
		{"wibblegood", "yumtastic", "froodly"},
	}
	var items []sentItem
	for i := range 600 {
		c := i % sentClasses
		stars := [sentClasses]int{1 + i/3%2, 3, 4 + i/3%2}[c]
		text := fmt.Sprintf("%s %s the player %d", words[c][i%3], words[c][(i/3)%3], i%17)
		items = append(items, sentItem{Text: text, Class: c, Stars: stars})
	}
	apps := []string{"com.example.a", "com.example.b", "com.example.c", "com.example.d", "com.example.e"} // 5 apps, 3 classes: each app has every class
	seedAdaptReviews(t, pool, apps, items)

	// Before anything is kept, the embedded model labels the reviews.
	job, _ := newTestSentimentJob(t, pool, 1000)
	embedded := job.version
	job.watchModels = true
	job.refreshModel(ctx)
	if job.version != embedded {
		t.Fatalf("without a stored model the job uses %s, want the embedded %s", job.version, embedded)
	}
	scoreAll(t, job)

	var out, progress bytes.Buffer
	if _, err := adaptSentiment(ctx, pool, adaptOptions{minPerClass: 1000, limit: 100000}, &out, &progress); err == nil ||
		!strings.Contains(err.Error(), "en has ") || !strings.Contains(err.Error(), "need 1000 of each") {
		t.Fatalf("too few reviews: want an error with the counts, got %v", err)
	}
	fig, err := adaptSentiment(ctx, pool, adaptOptions{minPerClass: 20, limit: 100000}, &out, &progress)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("adapt:\n%s%s", progress.String(), out.String())
	if !fig.Kept || fig.HeldOut["adapted"].MacroF1 < fig.HeldOut["embedded"].MacroF1+adaptMinGain {
		t.Fatalf("adapt did not keep a model that should win: %+v", fig)
	}
	for _, lang := range []string{"fa", "en"} {
		if fig.Dev[lang]["adapted"] < fig.Dev[lang]["embedded"]-adaptMaxDevLoss {
			t.Errorf("kept a model that loses on dev-%s: %v", lang, fig.Dev[lang])
		}
	}
	if len(fig.HeldOutApps) == 0 || len(fig.HeldOutApps) == len(apps) {
		t.Errorf("held-out apps %v of %d", fig.HeldOutApps, len(apps))
	}
	stored := storedSentimentModels(t, pool)
	if len(stored) != 1 {
		t.Fatalf("%d stored models, want 1", len(stored))
	}
	var version string
	for v, f := range stored {
		version = v
		if !f.Kept || f.HeldOut["adapted"] != fig.HeldOut["adapted"] || f.Base != embedded {
			t.Errorf("stored figures %+v, want those adapt printed", f)
		}
	}
	if !strings.Contains(out.String(), "kept as model "+version) {
		t.Errorf("adapt's output does not name the kept model %s:\n%s", version, out.String())
	}

	// The job switches at its next check, and labels new work with it.
	job.modelCheckedAt = job.clock.Now().Add(-sentimentModelCheckEvery)
	job.refreshModel(ctx)
	if job.version != version {
		t.Fatalf("the job uses %s, want the stored %s", job.version, version)
	}
	current, err := currentSentimentModel(ctx, pool)
	if err != nil || current.Version() != version {
		t.Fatalf("current model %v %v, want %s", current, err, version)
	}
	n, err := rescoreSentiment(ctx, pool, false, version, 1000, func(int64, int64) {})
	if err != nil || n != int64(len(items)) {
		t.Fatalf("rescore --model-older marked %d (%v), want all %d the embedded model scored", n, err, len(items))
	}
	scoreAll(t, job)
	var models []string
	rows, err := pool.Query(ctx, `SELECT DISTINCT sentiment_model FROM reviews`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			t.Fatal(err)
		}
		models = append(models, m)
	}
	if len(models) != 1 || models[0] != version {
		t.Errorf("reviews scored by %v, want only the adapted %s", models, version)
	}
	// The jargon is learnt: a held-out style text the embedded model called
	// neutral or worse is now positive.
	adapted, err := loadStoredSentimentModel(ctx, pool, version)
	if err != nil {
		t.Fatal(err)
	}
	if r := adapted.Classify("froodly yumtastic", 0); r.Label != "POSITIVE" {
		t.Errorf("adapted model: %q is %s, want POSITIVE", "froodly yumtastic", r.Label)
	}

	// classify --model db labels with it; without --model, the embedded one.
	env := envFunc(map[string]string{"DATABASE_URL": pool.Config().ConnString()})
	for _, c := range []struct {
		args  []string
		label string
	}{{[]string{"--model", "db"}, "POSITIVE"}, {nil, ""}} {
		var stdout, stderr bytes.Buffer
		if err := cmdSentimentClassify(ctx, c.args, env, strings.NewReader("froodly yumtastic\n"), &stdout, &stderr); err != nil {
			t.Fatalf("classify %v: %v (%s)", c.args, err, stderr.String())
		}
		fromDB := strings.Contains(stderr.String(), "sentiment model "+version+" (from the database)")
		if fromDB != (c.label != "") || c.label != "" && !strings.Contains(stdout.String(), `"label":"`+c.label+`"`) {
			t.Errorf("classify %v: stdout %q stderr %q, want the database's model %v", c.args, stdout.String(), stderr.String(), c.label != "")
		}
	}
}

// TestSentimentAdaptOnRecordedReviews: on the recorded Play Store reviews
// (real texts, stars as labels) adapt keeps a model exactly when its rule
// says so.
func TestSentimentAdaptOnRecordedReviews(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	items := playstoreSentimentItems(t)
	seedAdaptReviews(t, pool, []string{"com.example.one", "com.example.two", "com.example.three", "com.example.four", "com.example.five"}, items)
	var out, progress bytes.Buffer
	fig, err := adaptSentiment(ctx, pool, adaptOptions{minPerClass: 5, limit: 100000}, &out, &progress)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("adapt on %d recorded reviews:\n%s", len(items), out.String())
	kept, _ := adaptDecision(fig)
	if kept != fig.Kept || len(storedSentimentModels(t, pool)) != map[bool]int{false: 0, true: 1}[kept] {
		t.Errorf("rule says kept=%v, adapt says %v, %d stored", kept, fig.Kept, len(storedSentimentModels(t, pool)))
	}
}
