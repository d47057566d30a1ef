package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// storefrontRows are an app's app_storefronts rows, "position:country/lang".
func storefrontRows(t *testing.T, f *registryFixture, pkg string) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `
SELECT s.position, s.country, s.lang FROM app_storefronts s JOIN apps_registry_application a ON a.id = s.application_id
WHERE a.package_name = $1 ORDER BY s.position`, pkg)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var pos int
		var c, l string
		if err := rows.Scan(&pos, &c, &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%d:%s/%s", pos, c, l))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// shownStorefronts are the storefronts of an app answer, "country/lang".
func shownStorefronts(t *testing.T, body string) string {
	t.Helper()
	var a struct {
		Storefronts []locale `json:"storefronts"`
	}
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	var out []string
	for _, s := range a.Storefronts {
		out = append(out, s.Country+"/"+s.Lang)
	}
	return strings.Join(out, ",")
}

func TestRegistryStorefronts(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	r := f.do(t, "POST", "/api/v1/apps", `{"package_name":"org.telegram.messenger","storefronts":[{"country":"ir","lang":"fa"},{"country":"us","lang":"en"}]}`)
	if r.code != 201 || shownStorefronts(t, r.body) != "ir/fa,us/en" {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	checkOpenAPISchema(t, "App", r.body)
	if got := storefrontRows(t, f, "org.telegram.messenger"); !slices.Equal(got, []string{"0:ir/fa", "1:us/en"}) {
		t.Fatalf("app_storefronts rows %v", got)
	}
	r = f.do(t, "GET", "/api/v1/apps/org.telegram.messenger", "")
	if r.code != 200 || shownStorefronts(t, r.body) != "ir/fa,us/en" {
		t.Fatalf("get: %d %s", r.code, r.body)
	}
	checkOpenAPISchema(t, "AppWithLastCrawl", r.body)

	// Registered the old way: the default storefront, from is_iranian_app,
	// and no rows.
	for _, body := range []string{`{"package_name":"com.example.old"}`, `{"package_name":"ir.example.old","is_iranian_app":true,"storefronts":null}`} {
		if r = f.do(t, "POST", "/api/v1/apps", body); r.code != 201 {
			t.Fatalf("%s: %d %s", body, r.code, r.body)
		}
	}
	for pkg, want := range map[string]string{"com.example.old": "us/en", "ir.example.old": "ir/fa"} {
		r = f.do(t, "GET", "/api/v1/apps/"+pkg, "")
		if r.code != 200 || shownStorefronts(t, r.body) != want {
			t.Errorf("get %s: %d %s, want storefronts %s", pkg, r.code, r.body, want)
		}
		checkOpenAPISchema(t, "AppWithLastCrawl", r.body)
		if rows := storefrontRows(t, f, pkg); len(rows) != 0 {
			t.Errorf("%s has rows %v", pkg, rows)
		}
	}
	// The default follows is_iranian_app, as it always did.
	if r = f.do(t, "PATCH", "/api/v1/apps/com.example.old", `{"is_iranian_app":true}`); r.code != 200 || shownStorefronts(t, r.body) != "ir/fa" {
		t.Fatalf("patch is_iranian_app: %d %s", r.code, r.body)
	}

	// PATCH replaces the list (and leaves it alone when not named).
	r = f.do(t, "PATCH", "/api/v1/apps/org.telegram.messenger",
		`{"storefronts":[{"country":"de","lang":"de"},{"country":"ir","lang":"fa"},{"country":"br","lang":"pt-BR"}]}`)
	if r.code != 200 || shownStorefronts(t, r.body) != "de/de,ir/fa,br/pt-BR" {
		t.Fatalf("patch: %d %s", r.code, r.body)
	}
	checkOpenAPISchema(t, "App", r.body)
	if got := storefrontRows(t, f, "org.telegram.messenger"); !slices.Equal(got, []string{"0:de/de", "1:ir/fa", "2:br/pt-BR"}) {
		t.Fatalf("after patch: rows %v", got)
	}
	if r = f.do(t, "PATCH", "/api/v1/apps/org.telegram.messenger", `{"display_name":"Telegram"}`); r.code != 200 ||
		shownStorefronts(t, r.body) != "de/de,ir/fa,br/pt-BR" {
		t.Fatalf("patch of another field: %d %s", r.code, r.body)
	}
	// A storefront given to an app that had the default one.
	if r = f.do(t, "PATCH", "/api/v1/apps/ir.example.old", `{"storefronts":[{"country":"ae","lang":"ar"}]}`); r.code != 200 ||
		shownStorefronts(t, r.body) != "ae/ar" {
		t.Fatalf("patch ir.example.old: %d %s", r.code, r.body)
	}

	// The list shows every app's storefronts, and filters by them (the
	// default storefront of an app without rows counts).
	r = f.do(t, "GET", "/api/v1/apps", "")
	checkOpenAPISchema(t, "AppList", r.body)
	var list struct {
		Apps []json.RawMessage `json:"apps"`
	}
	if err := json.Unmarshal([]byte(r.body), &list); err != nil || len(list.Apps) != 3 {
		t.Fatalf("list: %d %s", r.code, r.body)
	}
	var shown []string
	for _, a := range list.Apps {
		shown = append(shown, shownStorefronts(t, string(a)))
	}
	if want := []string{"ir/fa", "ae/ar", "de/de,ir/fa,br/pt-BR"}; !slices.Equal(shown, want) {
		t.Errorf("listed storefronts %q, want %q", shown, want)
	}
	check := func(query string, want ...string) {
		t.Helper()
		got, _ := listPackages(t, f, query)
		if !slices.Equal(got, want) {
			t.Errorf("list %s = %v, want %v", query, got, want)
		}
	}
	check("?country=ir", "com.example.old", "org.telegram.messenger")
	check("?country=ir&lang=fa", "com.example.old", "org.telegram.messenger")
	check("?country=br&lang=pt-BR", "org.telegram.messenger")
	check("?country=br&lang=de") // no one storefront has both
	check("?lang=ar", "ir.example.old")
	check("?country=us")

	// null: back to the default storefront.
	if r = f.do(t, "PATCH", "/api/v1/apps/org.telegram.messenger", `{"storefronts":null}`); r.code != 200 || shownStorefronts(t, r.body) != "us/en" {
		t.Fatalf("patch null: %d %s", r.code, r.body)
	}
	if rows := storefrontRows(t, f, "org.telegram.messenger"); len(rows) != 0 {
		t.Fatalf("after patch null: rows %v", rows)
	}
	check("?country=us", "org.telegram.messenger")
}

// GET /api/v1/apps/{package_name} gives each storefront's last crawl, and
// last_crawl is the first storefront's.
func TestRegistryLastCrawlPerStorefront(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	if r := f.do(t, "POST", "/api/v1/apps", `{"package_name":"org.telegram.messenger","storefronts":[{"country":"ir","lang":"fa"},{"country":"us","lang":"en"}]}`); r.code != 201 {
		t.Fatal(r.body)
	}
	if _, err := f.pool.Exec(context.Background(), `
INSERT INTO app_crawl_outcomes (application_id, country, lang, path, at, outcome, http_status, error)
SELECT id, 'ir', 'fa', 'stats', now(), 'ok', NULL, '' FROM apps_registry_application
UNION ALL SELECT id, 'us', 'en', 'stats', now(), 'not_found', 404, 'no such app' FROM apps_registry_application
UNION ALL SELECT id, 'us', 'en', 'reviews', now(), 'throttled', 429, 'throttled' FROM apps_registry_application
UNION ALL SELECT id, 'de', 'de', 'stats', now(), 'ok', NULL, '' FROM apps_registry_application`); err != nil {
		t.Fatal(err)
	}
	r := f.do(t, "GET", "/api/v1/apps/org.telegram.messenger", "")
	if r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	checkOpenAPISchema(t, "AppWithLastCrawl", r.body)
	type outcome struct {
		Outcome    string `json:"outcome"`
		HTTPStatus *int   `json:"http_status"`
	}
	type crawl struct {
		Stats   *outcome `json:"stats"`
		Reviews *outcome `json:"reviews"`
	}
	var body struct {
		Storefronts []struct {
			Country   string `json:"country"`
			Lang      string `json:"lang"`
			LastCrawl crawl  `json:"last_crawl"`
		} `json:"storefronts"`
		LastCrawl crawl `json:"last_crawl"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatal(err)
	}
	desc := func(c crawl) string {
		d := func(o *outcome) string {
			if o == nil {
				return "null"
			}
			if o.HTTPStatus != nil {
				return fmt.Sprintf("%s %d", o.Outcome, *o.HTTPStatus)
			}
			return o.Outcome
		}
		return d(c.Stats) + ", " + d(c.Reviews)
	}
	var got []string
	for _, s := range body.Storefronts {
		got = append(got, s.Country+"/"+s.Lang+": "+desc(s.LastCrawl))
	}
	if want := []string{"ir/fa: ok, null", "us/en: not_found 404, throttled 429"}; !slices.Equal(got, want) {
		t.Errorf("storefronts' last crawls %q, want %q", got, want)
	}
	if d := desc(body.LastCrawl); d != "ok, null" {
		t.Errorf("last_crawl %s, want the first storefront's (ok, null)", d)
	}
}

// Every bad storefronts member is a 400 naming it, and writes nothing.
func TestRegistryRefusesBadStorefronts(t *testing.T) {
	t.Parallel()
	f := newRegistryFixture(t, "")
	if r := f.do(t, "POST", "/api/v1/apps", `{"package_name":"com.example.app","storefronts":[{"country":"ir","lang":"fa"}]}`); r.code != 201 {
		t.Fatal(r.body)
	}
	sf := func(n int) string {
		var items []string
		for i := range n {
			items = append(items, fmt.Sprintf(`{"country":%q,"lang":"en"}`, assignedCountries[i]))
		}
		return "[" + strings.Join(items, ",") + "]"
	}
	cases := []struct{ name, storefronts, want string }{
		{"bad country", `[{"country":"us","lang":"en"},{"country":"u1","lang":"en"}]`, "storefronts[1].country must be an ISO 3166-1 alpha-2"},
		{"upper-case country", `[{"country":"IR","lang":"fa"}]`, `storefronts[0].country must be in lower case: "ir", not "IR"`},
		{"mixed-case country", `[{"country":"iR","lang":"fa"}]`, `storefronts[0].country must be in lower case`},
		{"unknown code", `[{"country":"us","lang":"en"},{"country":"uk","lang":"en"}]`, `storefronts[1].country "uk" is not an assigned`},
		{"unknown upper-case code", `[{"country":"XX","lang":"en"}]`, `storefronts[0].country must be an ISO 3166-1 alpha-2`},
		{"three-letter country", `[{"country":"irn","lang":"fa"}]`, "storefronts[0].country must be an ISO 3166-1 alpha-2"},
		{"empty country", `[{"country":"","lang":"fa"}]`, "storefronts[0].country must be an ISO 3166-1 alpha-2"},
		{"non-ascii country", `[{"country":"ایران","lang":"fa"}]`, "storefronts[0].country must be an ISO 3166-1 alpha-2"},
		{"bad lang", `[{"country":"ir","lang":"farsi"}]`, "storefronts[0].lang must be a language code"},
		{"upper-case lang", `[{"country":"us","lang":"EN"}]`, "storefronts[0].lang must be a language code"},
		{"lower-case region", `[{"country":"br","lang":"pt-br"}]`, "storefronts[0].lang must be a language code"},
		{"underscore region", `[{"country":"br","lang":"pt_BR"}]`, "storefronts[0].lang must be a language code"},
		{"empty lang", `[{"country":"us","lang":""}]`, "storefronts[0].lang must be a language code"},
		{"duplicate", `[{"country":"ir","lang":"fa"},{"country":"us","lang":"en"},{"country":"ir","lang":"fa"}]`, "storefronts[2] repeats storefronts[0]"},
		{"0 entries", `[]`, "storefronts must hold 1 to 20 storefronts, not 0"},
		{"21 entries", sf(21), "storefronts must hold 1 to 20 storefronts, not 21"},
		{"object, not list", `{"country":"ir","lang":"fa"}`, "storefronts has the wrong type"},
		{"string", `"ir/fa"`, "storefronts has the wrong type"},
		{"number", `20`, "storefronts has the wrong type"},
		{"list of strings", `["ir"]`, "storefronts[0] must be an object"},
		{"null entry", `[{"country":"ir","lang":"fa"},null]`, "storefronts[1] must be an object"},
		{"list in a list", `[[{"country":"ir","lang":"fa"}]]`, "storefronts[0] must be an object"},
		{"country number", `[{"country":98,"lang":"fa"}]`, "storefronts[0].country must be a string"},
		{"country null", `[{"country":null,"lang":"fa"}]`, "storefronts[0].country must be a string"},
		{"lang bool", `[{"country":"ir","lang":true}]`, "storefronts[0].lang must be a string"},
		{"missing lang", `[{"country":"ir"}]`, "storefronts[0].lang is required"},
		{"missing country", `[{"lang":"fa"}]`, "storefronts[0].country is required"},
		{"unknown member", `[{"country":"ir","lang":"fa","currency":"irr"}]`, `storefronts[0].currency is an unknown field`},
		{"member in another case", `[{"Country":"ir","lang":"fa"}]`, `storefronts[0].Country is an unknown field`},
		{"repeated member", `[{"country":"ir","lang":"fa","country":"us"}]`, "storefronts[0].country is given twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, req := range []struct{ method, path, body string }{
				{"POST", "/api/v1/apps", `{"package_name":"com.example.other","storefronts":` + tc.storefronts + `}`},
				{"PATCH", "/api/v1/apps/com.example.app", `{"display_name":"changed","storefronts":` + tc.storefronts + `}`},
			} {
				r := f.do(t, req.method, req.path, req.body)
				var e errorResponse
				if r.code != 400 || json.Unmarshal([]byte(r.body), &e) != nil || !strings.Contains(e.Error, tc.want) {
					t.Errorf("%s %s: %d %s, want 400 with %q", req.method, req.body, r.code, r.body, tc.want)
				}
			}
		})
	}
	// A bad list filter is a 400 naming the parameter.
	for query, want := range map[string]string{
		"?country=IR":   `country must be in lower case`,
		"?country=zz":   `country "zz" is not an assigned`,
		"?country=":     `country must be an ISO 3166-1 alpha-2`,
		"?lang=pt_BR":   `lang must be a language code`,
		"?lang=fa&lang": `query parameter "lang" is given 2 times`,
	} {
		r := f.do(t, "GET", "/api/v1/apps"+query, "")
		var e errorResponse
		if r.code != 400 || json.Unmarshal([]byte(r.body), &e) != nil || !strings.Contains(e.Error, want) {
			t.Errorf("GET %s: %d %s, want 400 with %q", query, r.code, r.body, want)
		}
	}
	if n := count(t, f.pool, `SELECT count(*) FROM apps_registry_application`); n != 1 {
		t.Errorf("%d apps after the refusals, want 1", n)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM apps_registry_application WHERE display_name IS NOT NULL`); n != 0 {
		t.Errorf("a refused PATCH changed the app")
	}
	if got := storefrontRows(t, f, "com.example.app"); !slices.Equal(got, []string{"0:ir/fa"}) {
		t.Errorf("storefronts after the refusals %v, want [0:ir/fa]", got)
	}
	// The largest list is accepted.
	if r := f.do(t, "PATCH", "/api/v1/apps/com.example.app", `{"storefronts":`+sf(20)+`}`); r.code != 200 || len(storefrontRows(t, f, "com.example.app")) != 20 {
		t.Errorf("20 storefronts: %d %s", r.code, r.body)
	}
}

func TestStorefrontLangShapes(t *testing.T) {
	for _, ok := range []string{"en", "fa", "fil", "pt-BR", "es-419", "zh-TW"} {
		if err := validateLang("lang", ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"e", "engl", "EN", "en-", "en-us", "en-USA", "es-41", "es-4190", "en_US", "en-US\n", " en", "zh-Hant"} {
		if validateLang("lang", bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The table of country codes is ISO 3166-1's, as Debian's iso-codes has it
// where installed, and the OpenAPI document lists the same codes.
func TestStorefrontCountriesAreISO3166(t *testing.T) {
	if len(assignedCountries) != 249 || !slices.IsSorted(assignedCountries) {
		t.Fatalf("%d codes (sorted: %v), want the 249 assigned ones, sorted", len(assignedCountries), slices.IsSorted(assignedCountries))
	}
	type schema struct {
		Enum []string `json:"enum"`
	}
	if got := openAPISchemas[schema](t)["StorefrontCountry"].Enum; !slices.Equal(got, assignedCountries) {
		t.Errorf("api/openapi.json StorefrontCountry lists %d codes that are not the table's %d", len(got), len(assignedCountries))
	}
	raw, err := os.ReadFile("/usr/share/iso-codes/json/iso_3166-1.json")
	if err != nil {
		t.Skipf("iso-codes is not installed (Debian: iso-codes): %v", err)
	}
	var iso struct {
		Countries []struct {
			Alpha2 string `json:"alpha_2"`
		} `json:"3166-1"`
	}
	if err := json.Unmarshal(raw, &iso); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range iso.Countries {
		want = append(want, strings.ToLower(c.Alpha2))
	}
	slices.Sort(want)
	if !slices.Equal(assignedCountries, want) {
		t.Errorf("the table differs from iso-codes: table %v\niso-codes %v", assignedCountries, want)
	}
}
