package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStatusPageInBrowser loads the status page of an appliance filled the
// way `make demo` fills it (the replay Play Store, a capture of each
// scenario) in a real headless Chromium, driven over the DevTools protocol
// on a pipe: it checks the charts are drawn with data points, that the
// page logs no console error (a CSP violation is one) and that every
// request the page makes goes to loopback, and keeps screenshots in
// .cache/status-page for a person to look at. Chromium's own background
// traffic is not the page's and is not counted; its host resolver maps
// every name but loopback to nothing, so nothing leaves anyway.
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	chromium := firstOnPath("chromium", "chromium-browser")
	if chromium == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is required under CI=true (.ci/run installs Debian's chromium)")
		}
		t.Skip("chromium is not on PATH (Debian: apt-get install chromium): the real-browser check of the status page needs it")
	}
	a := fillDemoLikeAppliance(t)
	shots := filepath.Join(".cache", "status-page")
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	b := startBrowser(t, chromium)

	for _, pg := range []struct {
		name, path string
		width      int
		dark       bool
		charts     []string // data-chart ids that must have points
		text       []string
	}{
		{"overview", "/", 1280, false, []string{"spark"}, []string{"Google Translate", "دیوار", "System health", "Dead letters, 24 h"}},
		{"overview-phone-dark", "/", 390, true, []string{"spark"}, []string{"Google Translate"}},
		{"app-translate", "/apps/com.google.android.apps.translate", 1280, false,
			[]string{"rating", "installs", "reviews", "histogram", "rtt", "releases"}, []string{"Newest negative reviews", "Releases and ratings", "UPLOAD", "DOWNLOAD"}},
		{"app-divar-phone", "/apps/ir.divar", 390, false, []string{"rating", "installs", "reviews"}, []string{"دیوار"}},
		// Its default storefront named as the storefront switch links name one.
		{"app-divar-storefront", "/apps/ir.divar?storefront=ir-fa", 1280, false, []string{"rating", "installs", "reviews"}, []string{"دیوار", "Newest negative reviews"}},
	} {
		t.Run(pg.name, func(t *testing.T) {
			v := b.visit(t, a.base+pg.path, pg.width, pg.dark)
			if err := os.WriteFile(filepath.Join(shots, pg.name+".png"), v.screenshot, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, e := range v.errors {
				t.Errorf("console: %s", e)
			}
			for _, u := range v.requests {
				if pu, err := url.Parse(u); err != nil || (pu.Hostname() != "127.0.0.1" && pu.Scheme != "data") {
					t.Errorf("the page requested %s, off loopback", u)
				}
			}
			if len(v.requests) == 0 {
				t.Error("no request seen: the network log does not work")
			}
			for _, id := range pg.charts {
				if v.points[id] == 0 {
					t.Errorf("chart %s has no data points drawn (svg elements by chart: %v)", id, v.points)
				}
			}
			for _, s := range pg.text {
				if !strings.Contains(strings.ToLower(v.text), strings.ToLower(s)) { // innerText follows text-transform
					t.Errorf("the page does not show %q", s)
				}
			}
		})
	}
	t.Logf("screenshots in %s", shots)
}

// fillDemoLikeAppliance is the demo's appliance and data: three apps with
// recorded listings (Google Translate with its recorded reviews, a
// messaging app here), a Persian-named Iranian app, one crawl, and a
// capture of each scenario.
func fillDemoLikeAppliance(t *testing.T) *e2eAppliance {
	t.Helper()
	replay := newReplayPlayStore(t)
	for _, pkg := range []string{"com.google.android.apps.translate", "com.mojang.minecraftpe", "com.adex77.WhereAmI"} {
		replay.setApp(pkg, replayApp{DetailsPage: readPlaystoreFixture(t, "details_"+pkg+"_en_us.html"), Reviews: 30})
	}
	replay.useFixtureReviews("com.google.android.apps.translate")
	replay.setApp("ir.divar", replayApp{Title: "دیوار", Reviews: 60, Persian: true})
	dir := tempDataDir(t)
	a := startE2EAppliance(t, map[string]string{
		"PLAYWATCH_DATA_DIR":    filepath.Join(dir, "data"),
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
		"PLAYSTORE_URL":         replay.URL,
		"RATE_LIMIT_REQUESTS":   "0",
		"EGRESS_MIN_GAP":        "0s",
		"REVIEWS_PER_APP":       "150",
	}, "--roles", "registry,consumer,sentiment") // crawl --once below plans the cycle: no scheduler may lead
	t.Cleanup(func() { _ = a.stop() })
	for _, body := range []string{
		`{"package_name":"com.google.android.apps.translate","is_messaging_app":true}`,
		`{"package_name":"com.mojang.minecraftpe"}`,
		`{"package_name":"com.adex77.WhereAmI"}`,
		`{"package_name":"ir.divar","is_iranian_app":true}`,
	} {
		if code, resp := httpDo(t, http.MethodPost, a.base+"/api/v1/apps", body); code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", body, code, resp)
		}
	}
	a.command("crawl", "--once")
	a.command("pcap", "--app", "com.google.android.apps.translate", "--scenario", "UPLOAD", filepath.Join("testdata", "pcap", "clean_upload.pcap"))
	a.command("pcap", "--app", "com.google.android.apps.translate", "--scenario", "DOWNLOAD", filepath.Join("testdata", "pcap", "delay_download.pcap"))
	a.waitDrained()
	return a
}

// browser is a headless Chromium driven over the DevTools protocol on
// --remote-debugging-pipe: NUL-terminated JSON messages on fds 3 and 4.
type browser struct {
	in     io.Writer
	mu     sync.Mutex
	nextID int
	calls  map[int]chan cdpMessage
	events map[string][]cdpMessage // by session
	notify chan struct{}
}

type cdpMessage struct {
	ID        int             `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

func startBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	toBrowser, in, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	out, fromBrowser, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
		"--user-data-dir="+t.TempDir(), "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions", "--hide-scrollbars",
		"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "about:blank")
	cmd.ExtraFiles = []*os.File{toBrowser, fromBrowser} // fds 3 and 4
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	toBrowser.Close()
	fromBrowser.Close()
	b := &browser{in: in, calls: map[int]chan cdpMessage{}, events: map[string][]cdpMessage{}, notify: make(chan struct{}, 1)}
	go b.read(out)
	t.Cleanup(func() {
		in.Close()
		cancel()
		_ = cmd.Wait()
		out.Close()
		if t.Failed() {
			var lines []string
			for l := range strings.Lines(stderr.String()) {
				if !strings.Contains(l, "dbus") { // no system bus in a container: noise
					lines = append(lines, l)
				}
			}
			t.Logf("chromium stderr:\n%s", strings.Join(lines, ""))
		}
	})
	return b
}

func (b *browser) read(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		raw, err := br.ReadBytes(0)
		if err != nil {
			return
		}
		var m cdpMessage
		if json.Unmarshal(raw[:len(raw)-1], &m) != nil {
			continue
		}
		b.mu.Lock()
		if m.ID != 0 {
			if c := b.calls[m.ID]; c != nil {
				c <- m
				delete(b.calls, m.ID)
			}
		} else {
			b.events[m.SessionID] = append(b.events[m.SessionID], m)
		}
		b.mu.Unlock()
		select {
		case b.notify <- struct{}{}:
		default:
		}
	}
}

func (b *browser) call(t *testing.T, session, method string, params any, result any) {
	t.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	c := make(chan cdpMessage, 1)
	b.calls[id] = c
	b.mu.Unlock()
	if params == nil {
		params = struct{}{}
	}
	p, _ := json.Marshal(params)
	msg, _ := json.Marshal(cdpMessage{ID: id, Method: method, Params: p, SessionID: session})
	if _, err := b.in.Write(append(msg, 0)); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	select {
	case m := <-c:
		if m.Error != nil {
			t.Fatalf("%s: %s", method, m.Error.Message)
		}
		if result != nil {
			if err := json.Unmarshal(m.Result, result); err != nil {
				t.Fatalf("%s: %v", method, err)
			}
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer from chromium within 30s", method)
	}
}

// visited is what one page load showed.
type visited struct {
	screenshot []byte
	requests   []string
	errors     []string
	points     map[string]int // drawn SVG data elements per data-chart id
	text       string
}

func (b *browser) visit(t *testing.T, pageURL string, width int, dark bool) visited {
	t.Helper()
	s, closeTab := b.newTab(t)
	defer closeTab()
	for _, domain := range []string{"Page", "Network", "Runtime", "Log"} {
		b.call(t, s, domain+".enable", nil, nil)
	}
	b.call(t, s, "Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600}, nil)
	scheme := "light"
	if dark {
		scheme = "dark"
	}
	b.call(t, s, "Emulation.setEmulatedMedia", map[string]any{"features": []map[string]string{{"name": "prefers-color-scheme", "value": scheme}}}, nil)
	b.navigate(t, s, pageURL)
	var v visited
	// The whole page, not just the first screen.
	var metrics struct {
		CSSContentSize struct{ Height float64 } `json:"cssContentSize"`
	}
	b.call(t, s, "Page.getLayoutMetrics", nil, &metrics)
	h := int(metrics.CSSContentSize.Height)
	b.call(t, s, "Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": max(h, 600), "deviceScaleFactor": 1, "mobile": width < 600}, nil)
	var shot struct{ Data string }
	b.call(t, s, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &shot)
	var err error
	if v.screenshot, err = base64.StdEncoding.DecodeString(shot.Data); err != nil {
		t.Fatal(err)
	}
	var eval struct {
		Result struct{ Value json.RawMessage }
	}
	b.call(t, s, "Runtime.evaluate", map[string]any{"returnByValue": true, "expression": `(() => {
		const points = {};
		for (const svg of document.querySelectorAll('svg[data-chart]')) {
			const id = svg.dataset.chart;
			points[id] = (points[id] || 0) + svg.querySelectorAll('circle, rect.bar, path.series').length;
		}
		return {points, text: document.body.innerText};
	})()`}, &eval)
	var page struct {
		Points map[string]int
		Text   string
	}
	if err := json.Unmarshal(eval.Result.Value, &page); err != nil {
		t.Fatal(err)
	}
	v.points, v.text = page.Points, page.Text

	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.events[s] {
		var p struct {
			Request struct{ URL string }
			Type    string
			Args    []struct{ Value any }
			Entry   struct{ Level, Text, URL string }
			Details struct{ Text string } `json:"exceptionDetails"`
		}
		_ = json.Unmarshal(e.Params, &p)
		switch e.Method {
		case "Network.requestWillBeSent":
			v.requests = append(v.requests, p.Request.URL)
		case "Runtime.consoleAPICalled":
			if p.Type == "error" || p.Type == "warning" {
				v.errors = append(v.errors, fmt.Sprint(p.Args))
			}
		case "Log.entryAdded":
			if p.Entry.Level == "error" || p.Entry.Level == "warning" {
				v.errors = append(v.errors, p.Entry.Text+" "+p.Entry.URL)
			}
		case "Runtime.exceptionThrown":
			v.errors = append(v.errors, p.Details.Text)
		}
	}
	return v
}

// newTab opens a blank tab and attaches to it: its session, and what
// closes it.
func (b *browser) newTab(t *testing.T) (string, func()) {
	t.Helper()
	var target struct{ TargetID string }
	b.call(t, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct{ SessionID string }
	b.call(t, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	return attached.SessionID, func() {
		b.call(t, "", "Target.closeTarget", map[string]any{"targetId": target.TargetID}, nil)
	}
}

// navigate opens pageURL in session s and waits (30 s at most) for its load
// event.
func (b *browser) navigate(t *testing.T, s, pageURL string) {
	t.Helper()
	b.call(t, s, "Page.navigate", map[string]any{"url": pageURL}, nil)
	deadline := time.After(30 * time.Second)
	for !b.seen(s, "Page.loadEventFired") {
		select {
		case <-b.notify:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%s did not load within 30s", pageURL)
		}
	}
}

func (b *browser) seen(session, method string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.events[session] {
		if e.Method == method {
			return true
		}
	}
	return false
}
