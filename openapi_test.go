package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
)

// routeRecorder is a routeMux that keeps what is registered on it.
type routeRecorder map[string]http.HandlerFunc

func (r routeRecorder) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	r[pattern] = h
}

// openAPIOperations reads the document's paths: for each, its methods in
// upper case, sorted.
func openAPIOperations(t *testing.T) map[string][]string {
	t.Helper()
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatalf("api/openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Fatalf("openapi %q, want 3.1.x", doc.OpenAPI)
	}
	ops := map[string][]string{}
	for path, item := range doc.Paths {
		ops[path] = []string{}
		for key := range item {
			switch key {
			case "get", "put", "post", "delete", "options", "head", "patch", "trace":
				ops[path] = append(ops[path], strings.ToUpper(key))
			}
		}
		slices.Sort(ops[path])
	}
	return ops
}

// The routes register adds and the operations of the document are the same
// set, and each path answers the methods it lacks with 405 and an Allow
// header naming exactly the documented ones.
func TestOpenAPIListsEveryRoute(t *testing.T) {
	routes := routeRecorder{}
	(&registryAPI{}).register(routes)
	(&notifyAPI{}).register(routes)
	docOps := openAPIOperations(t)

	var registered, documented []string
	fallbacks := map[string]http.HandlerFunc{}
	for pattern, h := range routes {
		method, path, ok := strings.Cut(pattern, " ")
		if !ok {
			fallbacks[pattern] = h
			path = pattern
		} else {
			registered = append(registered, method+" "+path)
		}
		if !strings.HasPrefix(path, "/api/v1/") {
			t.Errorf("route %q is outside /api/v1/", pattern)
		}
	}
	for path, methods := range docOps {
		for _, m := range methods {
			documented = append(documented, m+" "+path)
		}
	}
	slices.Sort(registered)
	slices.Sort(documented)
	if !slices.Equal(registered, documented) {
		t.Errorf("registered routes %q\ndocumented operations %q", registered, documented)
	}

	for path, methods := range docOps {
		h, ok := fallbacks[path]
		if !ok {
			t.Errorf("%s has no route answering its other methods with 405", path)
			continue
		}
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest("PUT", strings.NewReplacer("{package_name}", "a.b", "{id}", "1").Replace(path), nil))
		allow := strings.Split(rec.Header().Get("Allow"), ", ")
		slices.Sort(allow)
		if rec.Code != http.StatusMethodNotAllowed || !slices.Equal(allow, methods) {
			t.Errorf("PUT %s: %d, Allow %q; want 405 and the documented methods %q", path, rec.Code, allow, methods)
		}
	}
	for path := range fallbacks {
		if _, ok := docOps[path]; !ok {
			t.Errorf("fallback route %q is for a path the document lacks", path)
		}
	}
}

// The appliance serves the document it embeds, which is api/openapi.json.
func TestOpenAPIServed(t *testing.T) {
	file, err := os.ReadFile("api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, openAPIDocument) {
		t.Fatal("the embedded document differs from api/openapi.json")
	}
	reg := newMetricsRegistry("test")
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), &registryAPI{}, nil, nil, testLogger(t)))
	defer srv.Close()
	code, body, header := getPage(t, srv.URL+"/api/v1/openapi.json")
	if code != 200 || header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /api/v1/openapi.json: %d, Content-Type %q", code, header.Get("Content-Type"))
	}
	if !json.Valid([]byte(body)) || body != string(file) {
		t.Fatalf("served %d bytes that are not api/openapi.json", len(body))
	}
}

// openAPISchemas is the component schemas of api/openapi.json, by name, each
// decoded as an S (a map for any schema, a struct for the fields a test reads).
func openAPISchemas[S any](t *testing.T) map[string]S {
	t.Helper()
	var doc struct {
		Components struct {
			Schemas map[string]S `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Components.Schemas
}
