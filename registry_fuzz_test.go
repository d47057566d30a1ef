package main

import (
	"encoding/json"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// FuzzRegistryBodies feeds arbitrary bodies to the registry's decoding and
// validation: no panic, and every refusal is a 4xx with a JSON error.
func FuzzRegistryBodies(f *testing.F) {
	f.Add(`{"package_name":"org.telegram.messenger","is_messaging_app":true}`, "application/json")
	f.Add(`{"display_name":null,"category":"Tools","is_active":false}`, "")
	f.Add(`{"package_name":"com.x","display_name":"\u0000"}`, "application/x-www-form-urlencoded")
	f.Add(`[1,2]`, "text/plain")
	f.Add(`{"package_name":"a.b","storefronts":[{"country":"ir","lang":"fa"},{"country":"us","lang":"pt-BR"}]}`, "")
	f.Add(`{"storefronts":[{"country":"IR","lang":"fa","country":"ir"},null,[]]}`, "")
	f.Add(`{"storefronts":null,"is_active":true}`, "")
	f.Fuzz(func(t *testing.T, body, contentType string) {
		check := func(rec *httptest.ResponseRecorder) {
			var e errorResponse
			if rec.Code < 400 || rec.Code > 499 || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error == "" {
				t.Fatalf("refusal %d %q", rec.Code, rec.Body.String())
			}
		}
		req := httptest.NewRequest("POST", "/api/v1/apps", strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		rec := httptest.NewRecorder()
		if members, ok := decodeBody(rec, req); !ok {
			check(rec)
		} else if n, err := parseCreate(members); err == nil {
			if validatePackageName(n.PackageName) != nil {
				t.Fatalf("create accepted package %q", n.PackageName)
			}
			for _, s := range []*string{n.DisplayName, n.Category} {
				if s != nil && validateText("field", s, 255) != nil {
					t.Fatalf("create accepted text %q", *s)
				}
			}
			checkFuzzedStorefronts(t, n.Storefronts, false)
		}

		req = httptest.NewRequest("PATCH", "/api/v1/apps/a.b", strings.NewReader(body))
		rec = httptest.NewRecorder()
		raw, ok := decodeBody(rec, req)
		if !ok {
			check(rec)
			return
		}
		if p, err := parsePatch(raw); err == nil {
			for _, s := range []*string{p.DisplayName, p.Category} {
				if s != nil && validateText("field", s, 255) != nil {
					t.Fatalf("patch accepted text %q", *s)
				}
			}
			checkFuzzedStorefronts(t, p.Storefronts, !p.SetStorefronts)
		}
	})
}

// checkFuzzedStorefronts fails on an accepted list the registry must refuse:
// none is nil (the default storefront), else 1 to 20 valid, distinct ones.
func checkFuzzedStorefronts(t *testing.T, sfs []locale, mustBeNone bool) {
	t.Helper()
	if sfs == nil {
		return
	}
	if mustBeNone || len(sfs) > maxStorefronts {
		t.Fatalf("accepted storefronts %v", sfs)
	}
	for i, sf := range sfs {
		if validateCountry("c", sf.Country) != nil || validateLang("l", sf.Lang) != nil || slices.Contains(sfs[:i], sf) {
			t.Fatalf("accepted storefront %d %+v of %v", i, sf, sfs)
		}
	}
}
