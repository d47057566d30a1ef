package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// topicExample is one line of testdata/sentiment/topics.tsv.
type topicExample struct {
	line   int
	lang   string
	topics []string
	text   string
	test   bool // every 4th data line: the part measured, never tuned on
}

func loadTopicSet(t testing.TB) []topicExample {
	t.Helper()
	f, err := os.Open("testdata/sentiment/topics.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []topicExample
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.SplitN(line, "\t", 3)
		if len(parts) != 3 || (parts[0] != "fa" && parts[0] != "en") {
			t.Fatalf("topics.tsv:%d: want LANG<TAB>TOPICS<TAB>TEXT with LANG fa or en", n)
		}
		ex := topicExample{line: n, lang: parts[0], text: parts[2], test: (len(out)+1)%4 == 0}
		if parts[1] != "-" {
			for _, tp := range strings.Split(parts[1], ",") {
				if !slices.Contains(reviewTopics, tp) {
					t.Fatalf("topics.tsv:%d: unknown topic %q", n, tp)
				}
				ex.topics = append(ex.topics, tp)
			}
			slices.SortFunc(ex.topics, func(a, b string) int { return slices.Index(reviewTopics, a) - slices.Index(reviewTopics, b) })
		}
		out = append(out, ex)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// topicScores are true and false positives and false negatives, per topic.
type topicScores struct{ tp, fp, fn map[string]int }

func scoreTopics(c *topicClassifier, set []topicExample, test bool) topicScores {
	s := topicScores{map[string]int{}, map[string]int{}, map[string]int{}}
	for _, ex := range set {
		if ex.test != test {
			continue
		}
		got := c.Classify(ex.text)
		for _, tp := range got {
			if slices.Contains(ex.topics, tp) {
				s.tp[tp]++
			} else {
				s.fp[tp]++
			}
		}
		for _, tp := range ex.topics {
			if !slices.Contains(got, tp) {
				s.fn[tp]++
			}
		}
	}
	return s
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// micro is the micro-averaged precision and recall over all topics.
func (s topicScores) micro() (p, r float64) {
	var tp, fp, fn int
	for _, t := range reviewTopics {
		tp, fp, fn = tp+s.tp[t], fp+s.fp[t], fn+s.fn[t]
	}
	return ratio(tp, tp+fp), ratio(tp, tp+fn)
}

func (s topicScores) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-16s %5s %9s %6s\n", "topic", "n", "precision", "recall")
	for _, t := range reviewTopics {
		fmt.Fprintf(&b, "%-16s %5d %9.2f %6.2f\n", t, s.tp[t]+s.fn[t], ratio(s.tp[t], s.tp[t]+s.fp[t]), ratio(s.tp[t], s.tp[t]+s.fn[t]))
	}
	p, r := s.micro()
	fmt.Fprintf(&b, "%-16s %5s %9.2f %6.2f\n", "micro", "", p, r)
	return b.String()
}

// TestTopicQuality measures the topic classifier on the test part of the
// project's topic set (make eval-sentiment prints it) and keeps floors.
func TestTopicQuality(t *testing.T) {
	set := loadTopicSet(t)
	counts := map[string]int{}
	none := 0
	langs := map[string]int{}
	for _, ex := range set {
		langs[ex.lang]++
		if len(ex.topics) == 0 {
			none++
		}
		for _, tp := range ex.topics {
			counts[tp]++
		}
	}
	if len(set) < 400 || langs["fa"] < 150 || langs["en"] < 150 || none < 30 {
		t.Fatalf("topic set: %d reviews (%v), %d without a topic; want ≥ 400, both languages, reviews without a topic", len(set), langs, none)
	}
	for _, tp := range reviewTopics {
		if counts[tp] < 15 {
			t.Errorf("topic set: %d examples of %s, want ≥ 15", counts[tp], tp)
		}
	}
	c := newTopicClassifier()
	dev, test := scoreTopics(c, set, false), scoreTopics(c, set, true)
	t.Logf("topics, dev part (tuned on):\n%s", dev.table())
	t.Logf("topics, test part (every 4th review, measured only):\n%s", test.table())
	p, r := test.micro()
	if p < 0.85 || r < 0.70 {
		t.Errorf("test part: micro precision %.2f, recall %.2f; want ≥ 0.85 and ≥ 0.70", p, r)
	}
}

// TestTopicMorphology pins the Persian forms, the Finglish and the
// negations the patterns are written for.
func TestTopicMorphology(t *testing.T) {
	c := newTopicClassifier()
	for _, tc := range []struct {
		text string
		want []string
	}{
		{"تبلیغاتش زیاده", []string{"ads"}},
		{"تبليغات زيادي", []string{"ads"}}, // Arabic ي
		{"هیچ تبلیغی نداره", nil},
		{"بدون تبلیغات", nil},
		{"کرش نمیکنه", nil},
		{"کرش می‌کنه", []string{"crash"}},
		{"کرش می کنه", []string{"crash"}},
		{"نمی‌تونم وارد بشم", []string{"login"}},
		{"به‌روزرسانی جدید", []string{"update"}},
		{"بدون فیلتر‌شکن کار نمی‌کنه", []string{"network"}},
		{"بهترین شبکه اجتماعی", nil},
		{"the best social network", nil},
		{"network error again", []string{"network"}},
		{"خرید رمز ارز راحته", nil},
		{"رمزم رو قبول نمیکنه", []string{"login"}},
		{"ظاهرا خوبه", nil}, // "apparently", not the look
		{"به همه پیشنهاد میکنم", nil},
		{"برنامه داغونه", nil},
		{"گوشی داغ میکنه", []string{"battery"}},
		{"نتم قطع میشه", []string{"network"}},
		{"نتیجه خوب بود", nil},      // نت is a whole word only
		{"منو خیلی دوست داره", nil}, // منو "me", not the menu
		{"never crashes, no ads", nil},
		{"crashes all the time, and no ads", []string{"crash"}},
		{"CRASHES since the UPDATE", []string{"crash", "update"}},
		{"lotfan dark mode ezafe konid", []string{"ui", "feature_request"}},
		{"bedoone filtershekan kar nemikone", []string{"network"}},
		{"", nil},
	} {
		got := c.Classify(tc.text)
		if got == nil {
			t.Fatalf("Classify(%q) is nil, want a non-nil slice", tc.text)
		}
		if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
			t.Errorf("Classify(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

// BenchmarkTopicClassify is the classifier on the topic set's texts, one
// core: docs/sentiment.md §8 gives its reviews per second.
func BenchmarkTopicClassify(b *testing.B) {
	set := loadTopicSet(b)
	c := newTopicClassifier()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		c.classifyMask(set[i%len(set)].text)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reviews/s")
}

// `sentiment classify` gives each line its topics, [] for none.
func TestSentimentClassifyPrintsTopics(t *testing.T) {
	out, _, err := runClassify(t, "از آپدیت آخر همش کرش میکنه\nLove it\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := `"topics":["crash","update"]}`; !strings.Contains(strings.Split(out, "\n")[0], want) {
		t.Errorf("first line %q, want it to end in %s", strings.Split(out, "\n")[0], want)
	}
	if want := `"topics":[]}`; !strings.Contains(strings.Split(out, "\n")[1], want) {
		t.Errorf("second line %q, want it to end in %s", strings.Split(out, "\n")[1], want)
	}
}
