package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

func testSentimentModel(t testing.TB) *sentimentModel {
	t.Helper()
	m, err := loadSentimentModel()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSentimentNormalize(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"Arabic yeh and kaf", "كيفيت عالي", "کیفیت عالی"},
		{"alef maksura, teh marbuta, hamza forms", "ى ة أ إ ؤ", "ی ه ا ا و"},
		{"ZWNJ joins like no space", "می‌شه", "میشه"},
		{"Persian digits", "نسخه ۵.۲", "نسخه 5.2"},
		{"Arabic-Indic digits", "٧٢ ساعت", "72 ساعت"},
		{"stretched Persian letter", "عاااالی", "عالی"},
		{"double Persian letter stays", "ببین", "ببین"},
		{"stretched Latin letter", "Gooooood", "good"},
		{"diacritics and tatweel", "خُوبـــه", "خوبه"},
		{"emoji kept, variation selector and skin tone dropped", "❤️👍🏽", "❤👍"},
		{"Persian punctuation", "خوبه، ولی؟", "خوبه, ولی?"},
		{"invalid UTF-8 becomes a space", "a\xffb", "a b"},
		{"upper case", "GREAT App", "great app"},
	} {
		if got := string(normalizeSentimentText(nil, c.in)); got != c.want {
			t.Errorf("%s: normalize(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
	}
}

// tokensOf is the normalised tokens of text, negated ones with a "!" prefix.
func tokensOf(text string) []string {
	sc := &sentScratch{}
	sc.norm = normalizeSentimentText(nil, text)
	tokenizeSentiment(sc)
	markSentimentTokens(sc)
	var out []string
	for _, tk := range sc.toks {
		if tk.kind == tokBreak {
			out = append(out, string(tk.punct))
			continue
		}
		s := string(sc.tb[tk.s:tk.e])
		if tk.negated {
			s = "!" + s
		}
		out = append(out, s)
	}
	return out
}

func TestSentimentTokensAndNegation(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"نمی شه", "نمیشه"},
		{"برنامه ها", "برنامهها"},
		{"this is not good at all, great", "this is not !good at all , great"}, // "at all" is emphasis
		{"I don't like it", "i dont !like it"},
		{"اصلا خوب", "اصلا !خوب"},            // اصلا without a verb negates
		{"اینو نمی‌پسندم", "!اینو نمیپسندم"}, // نمی‌ negates with every verb
		{"never works", "never !works"},
		{"اصلا خوب نیست", "!اصلا !خوب نیست"},
		{"هیچ مشکلی نداره", "هیچ !مشکلی !نداره"},
		{"بدون تبلیغ", "بدون !تبلیغ"},
		{"خوب نیست. عالیه", "!خوب نیست . عالیه"},
		{"😍👍", "😍 👍"},
	} {
		if got := strings.Join(tokensOf(c.in), " "); got != c.want {
			t.Errorf("tokens(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestSentimentNegationFlips: the lexicon reading of a negated phrase has
// the opposite sign, in both languages, and a negation inside a two-word
// entry is not applied twice.
func TestSentimentNegationFlips(t *testing.T) {
	m := testSentimentModel(t)
	for _, c := range []struct {
		text string
		sign int
	}{
		{"good", 1}, {"not good", -1}, {"never good", -1}, {"it isn't bad", 1},
		{"خوبه", 1}, {"خوب نیست", -1}, {"مشکل", -1}, {"هیچ مشکلی نداره", 1},
		{"تبلیغ", -1}, {"بدون تبلیغ", 1}, {"باز نمیشه", -1}, {"کار نمیکنه", -1},
		{"khoobe", 1}, {"kar nemikone", -1},
		{"not bad at all", 1}, {"never crashes", 1}, {"not too bad", 1}, {"بد نیست", 1}, {"اصلا خوب", -1},
	} {
		lang := detectSentimentLang(c.text)
		_, l := m.textProbabilities(c.text, lang)
		if s := l.compound(); (c.sign > 0 && s <= 0) || (c.sign < 0 && s >= 0) {
			t.Errorf("lexicon compound of %q = %.3f, want sign %+d", c.text, s, c.sign)
		}
	}
}

func TestSentimentLanguage(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"عالیه", "fa"}, {"great app", "en"}, {"kheili khoobe", "en"}, {"좋아요", "other"},
		{"👍👍", "other"}, {"", "other"}, {"برنامه خوبیه but slow", "fa"}, {"Отлично", "other"},
	} {
		if got := detectSentimentLang(c.text); got != c.want {
			t.Errorf("lang(%q) = %s, want %s", c.text, got, c.want)
		}
	}
}

func TestSentimentClassify(t *testing.T) {
	m := testSentimentModel(t)
	if v := m.Version(); !strings.HasPrefix(v, "lr1-") || len(v) > 40 {
		t.Errorf("version %q", v)
	}
	for _, c := range []struct {
		text  string
		stars int
		want  string
	}{
		{"Crashes since the update, fix it", 5, "NEGATIVE"},   // the text wins a clear disagreement
		{"از آپدیت آخر باز نمیشه، درستش کنید", 5, "NEGATIVE"}, // the same in Persian
		{"ok", 5, "POSITIVE"}, // a weak text follows the stars
		{"ok", 1, "NEGATIVE"},
		{"Love it, works great", 0, "POSITIVE"},
		{"Terrible, keeps crashing", 0, "NEGATIVE"},
		{"عالیه، ممنون از سازنده", 0, "POSITIVE"},
		{"افتضاحه، پولم برنگشت", 0, "NEGATIVE"},
		{"좋아요", 5, "POSITIVE"}, // other script: the stars alone
		{"좋아요", 0, "NEUTRAL"},
		{"😍😍😍", 0, "POSITIVE"}, // emoji alone are read by the text model
		{"😡", 0, "NEGATIVE"},
		{"not bad at all", 5, "POSITIVE"},
		{"never crashes", 0, "POSITIVE"},
		{"بد نیست", 0, "POSITIVE"},
		{"good app", 0, "POSITIVE"},
		{"I updated the app yesterday", 0, "NEUTRAL"}, // a statement: the neutral band
		{"", 0, "NEUTRAL"},
		{"", 1, "NEGATIVE"},
		{"   ...  ", 0, "NEUTRAL"},
	} {
		r := m.Classify(c.text, c.stars)
		if r.Label != c.want {
			t.Errorf("Classify(%q, %d) = %s (%+v), want %s", c.text, c.stars, r.Label, r, c.want)
		}
		if s := r.PPositive + r.PNeutral + r.PNegative; math.Abs(s-1) > 1e-9 {
			t.Errorf("Classify(%q): probabilities sum to %v", c.text, s)
		}
	}
}

// TestSentimentConcurrent: Classify shares its model across goroutines
// (go test -race checks the sharing) and gives the same answer.
func TestSentimentConcurrent(t *testing.T) {
	m := testSentimentModel(t)
	want := m.Classify("خیلی کند شده ولی هنوز خوبه", 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				if got := m.Classify("خیلی کند شده ولی هنوز خوبه", 4); got != want {
					t.Errorf("concurrent Classify = %+v, want %+v", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// runClassify runs `playwatch sentiment classify` in-process with input on stdin.
func runClassify(t *testing.T, input string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	f, ferr := os.Create(filepath.Join(t.TempDir(), "stdin"))
	if ferr != nil {
		t.Fatal(ferr)
	}
	if _, ferr := f.WriteString(input); ferr != nil {
		t.Fatal(ferr)
	}
	if _, ferr := f.Seek(0, 0); ferr != nil {
		t.Fatal(ferr)
	}
	saved := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = saved; f.Close() }()
	var out, errb strings.Builder
	err = run(context.Background(), append([]string{"sentiment", "classify"}, args...), envFunc(nil), &out, &errb)
	return out.String(), errb.String(), err
}

func decodeClassifyLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var rows []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("output line %q: %v", line, err)
		}
		rows = append(rows, r)
	}
	return rows
}

func TestSentimentClassifyCommand(t *testing.T) {
	out, stderr, err := runClassify(t, "Love it, works great\n\nافتضاحه، همش کرش میکنه\r\nbad \xff line\n좋아요\n")
	if err == nil || !strings.Contains(stderr, "line 4: not valid UTF-8") {
		t.Fatalf("want an error naming line 4; err %v, stderr %q", err, stderr)
	}
	rows := decodeClassifyLines(t, out)
	want := [][2]string{{"POSITIVE", "en"}, {"NEUTRAL", "other"}, {"NEGATIVE", "fa"}, {"NEUTRAL", "other"}}
	if len(rows) != len(want) {
		t.Fatalf("%d output lines, want %d:\n%s", len(rows), len(want), out)
	}
	for i, w := range want {
		if rows[i]["label"] != w[0] || rows[i]["lang"] != w[1] {
			t.Errorf("line %d: %v, want %s %s", i+1, rows[i], w[0], w[1])
		}
		sum := rows[i]["p_positive"].(float64) + rows[i]["p_neutral"].(float64) + rows[i]["p_negative"].(float64)
		if math.Abs(sum-1) > 1e-3 {
			t.Errorf("line %d: probabilities sum to %v", i+1, sum)
		}
	}
	if len(rows[0]) != 6 {
		t.Errorf("want exactly label, lang, three probabilities and topics, got %v", rows[0])
	}

	out, stderr, err = runClassify(t, `{"text":"Crashes since the update, fix it","score":5}
{"text":"ok","score":1}
{"text":"ok"}
{"text":"ok","score":9}
not json
{"score":3}
`, "--json")
	if err == nil || !strings.Contains(stderr, "line 4: score 9 is not 1..5") || !strings.Contains(stderr, "line 5:") || !strings.Contains(stderr, `line 6: no "text" field`) {
		t.Fatalf("want errors for lines 4-6; err %v, stderr %q", err, stderr)
	}
	rows = decodeClassifyLines(t, out)
	if len(rows) != 3 || rows[0]["label"] != "NEGATIVE" || rows[1]["label"] != "NEGATIVE" {
		t.Fatalf("json mode: %s", out)
	}

	out, _, err = runClassify(t, "عالی\n", "--lang", "en")
	if err != nil || decodeClassifyLines(t, out)[0]["lang"] != "en" {
		t.Fatalf("--lang en: %v %s", err, out)
	}
	if _, _, err := runClassify(t, "", "--lang", "de"); err == nil {
		t.Fatal("--lang de accepted")
	}
	out, _, err = runClassify(t, "", "--help")
	if err != nil || !strings.Contains(out, "exit status is 1") || !strings.Contains(out, "Model: lr1-") {
		t.Fatalf("--help: %v %q", err, out)
	}
}

// --json reads lines by the API's strict rule: an unknown field, a name
// given twice, a name in another case and a lone surrogate escape are
// refused with the line's number; the other lines are classified.
func TestSentimentClassifyJSONIsStrict(t *testing.T) {
	out, stderr, err := runClassify(t, `{"text":"Love it","score":5}
{"text":"Love it","stars":5}
{"text":"Love it","text":"Hate it"}
{"Text":"Love it"}
{"text":"Love it \ud83d"}
{"text":"Love it \ude00\ud83d"}
{"text":"Love it \ud83d\ude00","score":5}
[1]
{"text":"ok"} {"text":"ok"}
{"text":5}
`, "--json")
	for _, want := range []string{`line 2: unknown field "stars" (known: text, score)`, "line 3: text is given twice",
		`line 4: unknown field "Text"`, `line 5: holds a lone surrogate \ud83d at byte 17`, `line 6: holds a lone surrogate \ude00`,
		"line 8: not a JSON object", "line 9: not a JSON object", "line 10: text has the wrong type"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "8 line(s) could not be classified: 2 3 4 5 6 8 9 10") {
		t.Errorf("err = %v", err)
	}
	if rows := decodeClassifyLines(t, out); len(rows) != 2 || rows[0]["label"] != "POSITIVE" || rows[1]["label"] != "POSITIVE" {
		t.Errorf("want lines 1 and 7 classified, got:\n%s", out)
	}
}

func FuzzSentimentClassify(f *testing.F) {
	for _, s := range []string{"", "عاااالی", "not good", "هیچ مشکلی نداره", "❤️👍🏽", "a\xffb", "می‌شه نمی شه برنامه ها", "ااا\u064bا", "' ' '"} {
		f.Add(s, 5)
	}
	m := testSentimentModel(f)
	f.Fuzz(func(t *testing.T, text string, stars int) {
		n := normalizeSentimentText(nil, text)
		if !utf8.Valid(n) {
			t.Fatalf("normalize(%q) is not valid UTF-8", text)
		}
		if again := normalizeSentimentText(nil, string(n)); string(again) != string(n) {
			t.Fatalf("normalize is not idempotent: %q → %q → %q", text, n, again)
		}
		r := m.Classify(text, stars)
		s := r.PPositive + r.PNeutral + r.PNegative
		if math.IsNaN(s) || math.Abs(s-1) > 1e-9 || r.Label == "" || (r.Lang != "fa" && r.Lang != "en" && r.Lang != "other") {
			t.Fatalf("Classify(%q, %d) = %+v", text, stars, r)
		}
	})
}
