package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRelayedRequestOutlivesTheAnswer: the request a test proxy sends on
// keeps its whole body after the proxy has begun to answer. Go's HTTP/1
// server drains and closes an inbound body when the answer's head goes out
// (golang/go#40747); the proxies used to pass that body on as it was, so
// their upstream transport, reading it once more after its last byte, now
// and then found it closed, failed the write and closed the upstream
// connection under the answer being relayed. The client got the answer cut
// short with a clean chunked end: in the fleet test, a reviews page that did
// not parse (about one in a hundred under load).
func TestRelayedRequestOutlivesTheAnswer(t *testing.T) {
	form := "f.req=" + strings.Repeat("x", 4<<10)
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, err := relayedRequest(r)
		if err != nil {
			got <- "relayedRequest: " + err.Error()
			return
		}
		// The answer's head goes out before the relayed body is read.
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		body, err := io.ReadAll(out.Body)
		switch {
		case err != nil:
			got <- "reading the relayed body: " + err.Error()
		case out.ContentLength != int64(len(body)):
			got <- "ContentLength does not match the body"
		default:
			got <- string(body)
		}
	}))
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL, "application/x-www-form-urlencoded", strings.NewReader(form))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if g := <-got; g != form {
		t.Errorf("relayed body: %.80q, want the %d bytes sent", g, len(form))
	}
}
