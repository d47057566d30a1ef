package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// `playwatch sentiment adapt` (docs/sentiment.md §10): the stored reviews
// with their stars are the user's own in-domain labels (1–2★ NEGATIVE, 3★
// NEUTRAL, 4–5★ POSITIVE; the text alone is the input). adapt goes on
// training the embedded model on them, per language and class-balanced,
// holds out the reviews of some apps, and keeps the result in
// sentiment_models only when it beats the embedded model there by
// adaptMinGain macro-F1 and loses at most adaptMaxDevLoss on the project's
// dev sets.

const (
	adaptMinGain    = 0.02
	adaptMaxDevLoss = 0.02
	adaptEpochs     = 4
	// adaptHeldOutShare: about one app in five is held out (by hash of its
	// package name), at least one.
	adaptHeldOutShare = 5
)

// adaptOptions are the command's flags.
type adaptOptions struct {
	minPerClass int  // reviews of each class a language needs in the training split
	limit       int  // newest reviews read, at most
	dryRun      bool // measure, keep nothing
}

// adaptReview is one stored review with its weak label.
type adaptReview struct {
	app   string
	text  string
	lang  string
	class int
}

// adaptFigures is what adapt measured, stored as sentiment_models.figures.
type adaptFigures struct {
	Base         string                        `json:"base"` // the embedded model's version
	Languages    []string                      `json:"languages"`
	Train        map[string][sentClasses]int   `json:"train"` // per language: negative, neutral, positive
	HeldOutApps  []string                      `json:"held_out_apps"`
	HeldOut      map[string]adaptScore         `json:"held_out"`     // "embedded", "adapted"
	Dev          map[string]map[string]float64 `json:"dev_macro_f1"` // "fa"/"en" → "embedded"/"adapted"
	Kept         bool                          `json:"kept"`
	Reason       string                        `json:"reason"`
	HeldOutItems int                           `json:"held_out_items"`
}

type adaptScore struct {
	MacroF1  float64 `json:"macro_f1"`
	BinaryF1 float64 `json:"binary_f1"`
}

const sentimentAdaptSynopsis = "sentiment adapt [--min-per-class N] [--limit N] [--dry-run] [flags]"

func cmdSentimentAdapt(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var opt adaptOptions
	cl, err := parseCommandLine("sentiment adapt", sentimentAdaptSynopsis, args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.IntVar(&opt.minPerClass, "min-per-class", 50, "reviews of each class (1–2★, 3★, 4–5★) a language needs in the training split")
		fs.IntVar(&opt.limit, "limit", 50000, "newest reviews with stars and text read, at most (their features are held in memory: about 2 KB each)")
		fs.BoolVar(&opt.dryRun, "dry-run", false, "measure the adapted model and keep nothing")
	})
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("sentiment adapt takes no arguments, got %q", cl.args)}
	}
	if opt.minPerClass < 1 || opt.limit < 1 {
		return usageError{"sentiment adapt: --min-per-class and --limit must be at least 1"}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	_, err = adaptSentiment(ctx, be.pool, opt, stdout, stderr)
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}

// adaptSentiment runs adapt on the database and returns its figures.
func adaptSentiment(ctx context.Context, pool *pgxpool.Pool, opt adaptOptions, stdout, stderr io.Writer) (*adaptFigures, error) {
	base, err := loadSentimentModel()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "reading up to %d reviews with stars and text\n", opt.limit)
	reviews, err := readAdaptReviews(ctx, pool, opt.limit)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "read %d reviews in Persian or English\n", len(reviews))
	heldOutApps, err := adaptHeldOutApps(reviews)
	if err != nil {
		return nil, err
	}
	fig := &adaptFigures{Base: base.Version(), Train: map[string][sentClasses]int{}, HeldOut: map[string]adaptScore{},
		Dev: map[string]map[string]float64{}, HeldOutApps: slices.Sorted(maps.Keys(heldOutApps))}
	var train, test []adaptReview
	for _, r := range reviews {
		if heldOutApps[r.app] {
			test = append(test, r)
		} else {
			train = append(train, r)
			c := fig.Train[r.lang]
			c[r.class]++
			fig.Train[r.lang] = c
		}
	}
	var short []string
	for _, lang := range []string{"fa", "en"} {
		c := fig.Train[lang]
		if min(c[0], c[1], c[2]) >= opt.minPerClass {
			fig.Languages = append(fig.Languages, lang)
		} else if c[0]+c[1]+c[2] > 0 {
			short = append(short, fmt.Sprintf("%s has %d negative (1–2★), %d neutral (3★), %d positive (4–5★)", lang, c[0], c[1], c[2]))
		}
	}
	if len(short) > 0 {
		fmt.Fprintf(stderr, "too few reviews to adapt in the training split (need %d of each class): %s\n", opt.minPerClass, strings.Join(short, "; "))
	}
	if len(fig.Languages) == 0 {
		if len(short) == 0 {
			return nil, errors.New("sentiment adapt: no stored review in Persian or English has both stars and text")
		}
		return nil, fmt.Errorf("sentiment adapt: too few reviews per class and language in the training split (need %d of each): %s", opt.minPerClass, strings.Join(short, "; "))
	}
	data := adaptTrainingSet(base, train, fig.Languages)
	fmt.Fprintf(stderr, "training on %d reviews (%s), %d epochs from model %s\n", len(data), strings.Join(fig.Languages, ", "), adaptEpochs, base.Version())
	w, bias := trainSentiment(data, base, adaptEpochs)
	file := encodeSentimentModel(w, bias, base.en)
	adapted, err := sentimentModelOf(file)
	if err != nil {
		return nil, fmt.Errorf("adapted model: %w", err)
	}
	var held []sentItem
	for _, r := range test {
		if slices.Contains(fig.Languages, r.lang) {
			held = append(held, sentItem{Text: r.text, Class: r.class})
		}
	}
	fig.HeldOutItems = len(held)
	if len(held) == 0 {
		return nil, fmt.Errorf("sentiment adapt: the held-out apps (%s) have no review in %s", strings.Join(fig.HeldOutApps, ", "), strings.Join(fig.Languages, ", "))
	}
	fmt.Fprintf(stderr, "measuring on %d reviews of %d held-out apps and on the dev sets\n", len(held), len(heldOutApps))
	for name, m := range map[string]*sentimentModel{"embedded": base, "adapted": adapted} {
		e := textModelEval(m, held)
		fig.HeldOut[name] = adaptScore{MacroF1: round4(e.macroF1()), BinaryF1: round4(e.binaryF1())}
	}
	dev, err := sentimentDevSets()
	if err != nil {
		return nil, err
	}
	for _, lang := range []string{"fa", "en"} {
		fig.Dev[lang] = map[string]float64{
			"embedded": round4(textModelEval(base, dev[lang]).macroF1()),
			"adapted":  round4(textModelEval(adapted, dev[lang]).macroF1()),
		}
	}
	fig.Kept, fig.Reason = adaptDecision(fig)
	printAdaptFigures(stdout, fig, adapted.Version())
	if !fig.Kept || opt.dryRun {
		if fig.Kept {
			fmt.Fprintln(stdout, "dry run: nothing kept")
		}
		return fig, nil
	}
	v, err := storeSentimentModel(ctx, pool, file, fig)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "kept as model %s in sentiment_models: every sentiment job switches to it within %s; `playwatch sentiment rescore --model-older` relabels the reviews other models scored\n", v, sentimentModelCheckEvery)
	return fig, nil
}

// adaptDecision is the rule: a gain of adaptMinGain on the held-out apps,
// a loss of at most adaptMaxDevLoss on each dev set.
func adaptDecision(f *adaptFigures) (bool, string) {
	gain := f.HeldOut["adapted"].MacroF1 - f.HeldOut["embedded"].MacroF1
	if gain < adaptMinGain-1e-9 {
		return false, fmt.Sprintf("on the held-out apps the adapted model gains %+.3f macro-F1, less than %.2f", gain, adaptMinGain)
	}
	for _, lang := range []string{"fa", "en"} {
		if loss := f.Dev[lang]["embedded"] - f.Dev[lang]["adapted"]; loss > adaptMaxDevLoss+1e-9 {
			return false, fmt.Sprintf("on the %s dev set it loses %.3f macro-F1, more than %.2f", lang, loss, adaptMaxDevLoss)
		}
	}
	return true, fmt.Sprintf("it gains %+.3f macro-F1 on the held-out apps and loses at most %.2f on the dev sets", gain, adaptMaxDevLoss)
}

func printAdaptFigures(w io.Writer, f *adaptFigures, adaptedVersion string) {
	fmt.Fprintf(w, "training split: ")
	for i, lang := range f.Languages {
		c := f.Train[lang]
		if i > 0 {
			fmt.Fprint(w, "; ")
		}
		fmt.Fprintf(w, "%s %d negative, %d neutral, %d positive", lang, c[0], c[1], c[2])
	}
	fmt.Fprintf(w, "\nheld out: %d reviews of %d apps (%s)\n", f.HeldOutItems, len(f.HeldOutApps), strings.Join(f.HeldOutApps, ", "))
	fmt.Fprintf(w, "%-28s %9s %9s %11s %11s\n", "model", "held-out", "binary", "dev-fa", "dev-en")
	for _, name := range []string{"embedded", "adapted"} {
		v := f.Base
		if name == "adapted" {
			v = adaptedVersion
		}
		s := f.HeldOut[name]
		fmt.Fprintf(w, "%-28s %9.3f %9.3f %11.3f %11.3f\n", name+" "+v, s.MacroF1, s.BinaryF1, f.Dev["fa"][name], f.Dev["en"][name])
	}
	verdict := "not kept"
	if f.Kept {
		verdict = "kept"
	}
	fmt.Fprintf(w, "%s: %s\n", verdict, f.Reason)
}

// textModelEval measures the text model alone (no stars) on items.
func textModelEval(m *sentimentModel, items []sentItem) *sentEval {
	e := &sentEval{}
	for _, it := range items {
		r := m.Classify(it.Text, 0)
		e.add(it.Class, classOfLabel(r.Label), r.PPositive, r.PNegative)
	}
	return e
}

func classOfLabel(label string) int {
	for c, l := range sentimentLabels {
		if l == label {
			return c
		}
	}
	return classNeutral
}

// readAdaptReviews reads the newest reviews with stars and text, and their
// app's package name; texts of another language are left out.
func readAdaptReviews(ctx context.Context, pool *pgxpool.Pool, limit int) ([]adaptReview, error) {
	rows, err := pool.Query(ctx, `SELECT a.package_name, r.content, r.score FROM reviews r
		JOIN apps_registry_application a ON a.id = r.application_id
		WHERE r.score BETWEEN 1 AND 5 AND r.content IS NOT NULL AND r.content <> ''
		ORDER BY r.id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("read reviews: %w", err)
	}
	var out []adaptReview
	var r adaptReview
	var stars int
	if _, err := pgx.ForEachRow(rows, []any{&r.app, &r.text, &stars}, func() error {
		if r.lang = detectSentimentLang(r.text); r.lang != "other" {
			r.class = starClass(stars)
			out = append(out, r)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read reviews: %w", err)
	}
	slices.Reverse(out) // oldest first: the training order does not depend on the newest row
	return out, nil
}

// adaptHeldOutApps picks the apps whose reviews are held out: those whose
// package name hashes to 0 mod adaptHeldOutShare, or the one of lowest hash
// when none does; every app but one at most.
func adaptHeldOutApps(reviews []adaptReview) (map[string]bool, error) {
	apps := map[string]uint32{}
	for _, r := range reviews {
		if _, ok := apps[r.app]; !ok {
			h := fnv.New32a()
			h.Write([]byte(r.app))
			apps[r.app] = h.Sum32()
		}
	}
	if len(apps) < 2 {
		return nil, fmt.Errorf("sentiment adapt: needs reviews of at least 2 apps, to hold some out; found %d", len(apps))
	}
	names := slices.Sorted(maps.Keys(apps))
	held := map[string]bool{}
	for _, a := range names {
		if apps[a]%adaptHeldOutShare == 0 {
			held[a] = true
		}
	}
	if len(held) == 0 || len(held) == len(names) {
		clear(held)
		lowest := names[0]
		for _, a := range names {
			if apps[a] < apps[lowest] {
				lowest = a
			}
		}
		held[lowest] = true
	}
	return held, nil
}

// adaptTrainingSet is the training split as examples, each language's
// classes weighing the same in total.
func adaptTrainingSet(m *sentimentModel, train []adaptReview, langs []string) []trainExample {
	counts := map[string][sentClasses]float64{}
	for _, r := range train {
		c := counts[r.lang]
		c[r.class]++
		counts[r.lang] = c
	}
	var out []trainExample
	for _, r := range train {
		if !slices.Contains(langs, r.lang) {
			continue
		}
		c := counts[r.lang]
		total := c[0] + c[1] + c[2]
		out = append(out, trainExample{feats: m.features(r.text, r.lang), class: r.class,
			weight: math.Min(total/(sentClasses*c[r.class]), 3)})
	}
	return out
}
