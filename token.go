package main

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// tokenWays are the ways a request may carry a token.
type tokenWays int

const (
	bearerToken tokenWays = 1 << iota // Authorization: Bearer <token>
	basicToken                        // HTTP basic auth, the token as the password (any user name)
)

// tokenGiven reports whether r carries token in one of ways; an empty token
// lets every request through. Basic auth, when allowed and sent, decides.
func tokenGiven(r *http.Request, token string, ways tokenWays) bool {
	if token == "" {
		return true
	}
	if ways&basicToken != 0 {
		if _, pass, ok := r.BasicAuth(); ok {
			return subtle.ConstantTimeCompare([]byte(pass), []byte(token)) == 1
		}
	}
	if ways&bearerToken != 0 {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
	}
	return false
}

// The WWW-Authenticate challenges of a refused request.
const (
	bearerChallenge = `Bearer realm="playwatch"`
	basicChallenge  = `Basic realm="playwatch status", charset="UTF-8"`
)

// requireTokenGiven answers 401 with challenge, through refuse, to a request
// that does not carry token() in one of ways, and passes the others to next.
// token is read per request: a route may be wrapped on a nil receiver (the
// OpenAPI test lists the routes).
func requireTokenGiven(token func() string, ways tokenWays, challenge string, refuse func(http.ResponseWriter), next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !tokenGiven(r, token(), ways) {
			w.Header().Set("WWW-Authenticate", challenge)
			refuse(w)
			return
		}
		next(w, r)
	}
}
