package main

import (
	_ "embed"
	"net/http"
)

// openAPIDocument is the contract of the registry API; openapi_test.go keeps
// its operations equal to the routes register adds.
//
//go:embed api/openapi.json
var openAPIDocument []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPIDocument)
}
