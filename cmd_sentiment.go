package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

const sentimentUsage = `Usage: playwatch sentiment COMMAND

Commands:
  run                                     run the sentiment job alone (scores stored reviews)
  rescore --all|--model-older             mark scored reviews for the job to score again
  classify [--lang auto|fa|en] [--json] [--model embedded|db]
                                          label review texts read on stdin, one JSON line each
  adapt [--min-per-class N] [--dry-run]   train on the stored reviews' stars; keep the model if it is better
`

// cmdSentiment dispatches `playwatch sentiment`.
func cmdSentiment(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	classify := func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		return cmdSentimentClassify(ctx, args, getenv, stdin, stdout, stderr)
	}
	return commandGroup{usage: sentimentUsage,
		subs:    map[string]commandFunc{"run": cmdSentimentRun, "rescore": cmdSentimentRescore, "classify": classify, "adapt": cmdSentimentAdapt},
		missing: "sentiment: no subcommand given", unknown: "sentiment: unknown subcommand %q"}.run(ctx, args, getenv, stdout, stderr)
}

const sentimentClassifyUsage = `Usage: playwatch sentiment classify [--lang auto|fa|en] [--json] [--model embedded|db]

Reads one review per line on stdin and writes one JSON object per line on stdout:
  {"label":"POSITIVE|NEUTRAL|NEGATIVE","lang":"fa|en|other","p_positive":…,"p_neutral":…,"p_negative":…,"topics":[…]}
topics are what the text is about, as the sentiment job stores them (docs/sentiment.md §8):
crash, performance, ads, login, payment, update, network, ui, notifications, battery,
privacy, support, feature_request; [] for none.
Without --json each line is the text; with --json each line is an object
{"text": "...", "score": 1..5} (score optional: without it the label is the text's alone,
with it the stored label of docs/sentiment.md §4). An empty text is NEUTRAL. Needs no
database and no broker, except with --model db.

A line that is not valid UTF-8 (or, with --json, not such an object: another field, a
name given twice or a lone surrogate escape such as \ud83d are refused) is reported on stderr
with its number and gets no output line; the other lines are still classified, and the
exit status is 1 at the end.

Flags:
  --lang auto|fa|en   language of the texts: auto decides per text by script (default "auto")
  --json              read JSON objects instead of plain lines
  --model embedded|db the embedded model (default), or the newest that sentiment adapt
                      kept in the database (DATABASE_URL, or the playwatch on the data
                      directory), the one the sentiment jobs use
`

// sentimentOutput is one line of `sentiment classify`.
type sentimentOutput struct {
	Label     string   `json:"label"`
	Lang      string   `json:"lang"`
	PPositive float64  `json:"p_positive"`
	PNeutral  float64  `json:"p_neutral"`
	PNegative float64  `json:"p_negative"`
	Topics    []string `json:"topics"`
}

func cmdSentimentClassify(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sentiment classify", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	lang := fs.String("lang", "auto", "")
	asJSON := fs.Bool("json", false, "")
	modelFrom := fs.String("model", "embedded", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, sentimentClassifyUsage)
			fmt.Fprintln(stdout, "\nEnvironment variables it reads with --model db ('playwatch --help' lists all):")
			printSettings(stdout, commandSettingList("sentiment classify"))
			if m, err := loadSentimentModel(); err == nil {
				fmt.Fprintf(stdout, "\nModel: %s (docs/sentiment.md)\n", m.Version())
			}
			return errHelp
		}
		fmt.Fprint(stderr, sentimentClassifyUsage)
		return usageError{"sentiment classify: " + err.Error()}
	}
	switch {
	case fs.NArg() > 0:
		return usageError{fmt.Sprintf("sentiment classify reads stdin and takes no arguments, got %q", fs.Args())}
	case *lang != "auto" && *lang != "fa" && *lang != "en":
		return usageError{fmt.Sprintf("sentiment classify: --lang must be auto, fa or en, got %q", *lang)}
	case *modelFrom != "embedded" && *modelFrom != "db":
		return usageError{fmt.Sprintf("sentiment classify: --model must be embedded or db, got %q", *modelFrom)}
	}
	model, err := loadSentimentModel()
	if *modelFrom == "db" {
		model, err = databaseSentimentModel(ctx, getenv, stderr)
	}
	if err != nil {
		return err
	}
	topics := newTopicClassifier()
	in := bufio.NewReaderSize(stdin, 64<<10)
	out := bufio.NewWriter(stdout)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	var bad []int
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, rerr := in.ReadBytes('\n')
		if rerr != nil && rerr != io.EOF {
			return fmt.Errorf("reading stdin: %w", rerr)
		}
		if rerr == io.EOF && len(line) == 0 {
			break
		}
		line = bytes.TrimRight(line, "\r\n")
		text, stars, err := classifyInput(line, *asJSON)
		if err != nil {
			fmt.Fprintf(stderr, "playwatch sentiment classify: line %d: %v\n", n, err)
			bad = append(bad, n)
		} else {
			var r sentimentResult
			if *lang == "auto" {
				r = model.Classify(text, stars)
			} else {
				r = model.classifyAs(text, stars, *lang)
			}
			if err := enc.Encode(sentimentOutput{r.Label, r.Lang, round4(r.PPositive), round4(r.PNeutral), round4(r.PNegative), topics.Classify(text)}); err != nil {
				return err
			}
		}
		if in.Buffered() == 0 { // interactive use: answer each line as it comes
			if err := out.Flush(); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			break
		}
	}
	if err := out.Flush(); err != nil {
		return err
	}
	if len(bad) > 0 {
		return fmt.Errorf("sentiment classify: %d line(s) could not be classified: %s", len(bad), strings.Trim(fmt.Sprint(bad), "[]"))
	}
	return nil
}

// classifyInput reads one input line: the text, or with asJSON the object
// {"text": ..., "score": 1..5}.
func classifyInput(line []byte, asJSON bool) (text string, stars int, err error) {
	if !utf8.Valid(line) {
		return "", 0, errors.New("not valid UTF-8")
	}
	if !asJSON || len(bytes.TrimSpace(line)) == 0 {
		return string(line), 0, nil
	}
	// The API's strict rule (httpjson.go): no lone surrogates (which
	// encoding/json turns into U+FFFD without a word), one object, no name
	// twice, only the known names, matched exactly.
	var textErr *jsonTextError
	if err := checkJSONText(line); errors.As(err, &textErr) {
		return "", 0, fmt.Errorf("holds %s at byte %d: send UTF-8 text", textErr.what, textErr.offset)
	}
	members, err := objectMembers(line)
	var memberErr *jsonMemberError
	switch {
	case errors.As(err, &memberErr):
		return "", 0, err
	case err != nil:
		return "", 0, fmt.Errorf("not a JSON object {\"text\": ..., \"score\": 1..5}: %w", err)
	}
	var in struct {
		Text  *string
		Score *int
	}
	for _, name := range slices.Sorted(maps.Keys(members)) {
		switch name {
		case "text":
			err = decodeField(name, members[name], &in.Text, "a string")
		case "score":
			err = decodeField(name, members[name], &in.Score, "an integer 1..5")
		default:
			err = fmt.Errorf("unknown field %q (known: text, score)", name)
		}
		if err != nil {
			return "", 0, err
		}
	}
	switch {
	case in.Text == nil:
		return "", 0, errors.New(`no "text" field`)
	case in.Score != nil && (*in.Score < 1 || *in.Score > 5):
		return "", 0, fmt.Errorf("score %d is not 1..5", *in.Score)
	case in.Score != nil:
		stars = *in.Score
	}
	return *in.Text, stars, nil
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }
