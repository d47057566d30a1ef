package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestExportCommand(t *testing.T) {
	t.Parallel()
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	seedReviewsAPI(t, pool)
	if _, err := pool.Exec(context.Background(), `INSERT INTO app_stats (application_id, country, lang, score, version, crawled_at)
		SELECT id, CASE WHEN is_iranian_app THEN 'ir' ELSE 'us' END, CASE WHEN is_iranian_app THEN 'fa' ELSE 'en' END, 4.5, '12.0', $1 FROM apps_registry_application WHERE package_name = 'ir.divar'`, testCrawl); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env := envFunc(map[string]string{"DATABASE_URL": dbURL, "PLAYWATCH_DATA_DIR": dir, "LOG_LEVEL": "warn"})
	export := func(args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"export"}, args...), env, &out, &errOut)
		return out.String(), errOut.String(), err
	}
	file := filepath.Join(dir, "reviews.csv")
	_, progress, err := export("reviews", "--stars", "1,2", "--sentiment", "NEGATIVE", "--since", testCrawl.Add(-30*24*time.Hour).Format(time.RFC3339), "--bom", "--output", file)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(file)
	recs, err := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(b, []byte("\uFEFF")))).ReadAll()
	if err != nil || !bytes.HasPrefix(b, []byte("\uFEFF")) || !slices.Equal(recs[0], reviewCSVFields) || len(recs) != 4 {
		t.Fatalf("%v %q", err, b)
	}
	if !strings.Contains(progress, "exported 3 reviews") {
		t.Errorf("progress on stderr: %q", progress)
	}
	out, _, err := export("reviews", "--format", "ndjson", "--q", "كيفيت")
	var r reviewOut
	if err != nil || json.Unmarshal([]byte(strings.TrimSpace(out)), &r) != nil || r.ReviewID != "fa1" {
		t.Errorf("ndjson: %v %q", err, out)
	}
	out, _, err = export("reviews", "--format", "json", "--package", "org.telegram.messenger")
	var page reviewsResponse
	if err != nil || json.Unmarshal([]byte(out), &page) != nil || len(page.Reviews) != 3 {
		t.Errorf("json: %v %q", err, out)
	}
	out, _, err = export("stats", "--package", "ir.divar", "--format", "json")
	var stats struct{ Stats []statsOut }
	if err != nil || json.Unmarshal([]byte(out), &stats) != nil || len(stats.Stats) != 1 || stats.Stats[0].Lang != "fa" ||
		!stats.Stats[0].CrawledAt.Equal(testCrawl) {
		t.Errorf("stats json: %v %q", err, out)
	}
	out, _, err = export("stats", "--package", "ir.divar", "--until", time.Now().Format(time.RFC3339))
	if err != nil || !strings.HasPrefix(out, strings.Join(statsFields, ",")+"\n") || !strings.Contains(out, ",ir,fa,4.5,") {
		t.Errorf("stats csv: %v %q", err, out)
	}
	for _, bad := range [][]string{{"reviews", "--stars", "9"}, {"stats"}, {"stats", "--package", "x"}, {"nothing"}, {"reviews", "extra"}} {
		if _, _, err := export(bad...); err == nil || !errorsAsUsage(err) {
			t.Errorf("export %q: %v, want a usage error", bad, err)
		}
	}
	if _, _, err := export("stats", "--package", "com.not.registered"); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("unregistered: %v", err)
	}
}

func errorsAsUsage(err error) bool {
	var u usageError
	return errors.As(err, &u)
}
