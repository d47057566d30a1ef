package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// maxBodyBytes bounds a request body; a larger one is answered with 413.
const maxBodyBytes = 64 << 10

// decodeBody reads a body of at most maxBodyBytes that is one JSON object
// and returns its members by name. Names are matched exactly by the callers
// (encoding/json would match them in any case), and a name given twice is
// refused (encoding/json would let the last one win). On failure it has
// written the 4xx answer.
func decodeBody(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, bool) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		// curl -d sends form encoding by default; the body is read as JSON anyway.
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json") && mt != "application/x-www-form-urlencoded") {
			writeError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q is not JSON: send application/json", ct))
			return nil, false
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err == nil {
		// encoding/json would store both as U+FFFD without a word.
		err = checkJSONText(body)
	}
	var members map[string]json.RawMessage
	if err == nil {
		members, err = objectMembers(body)
	}
	var maxErr *http.MaxBytesError
	var textErr *jsonTextError
	var memberErr *jsonMemberError
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case err == nil:
		return members, true
	case errors.Is(err, os.ErrDeadlineExceeded):
		writeError(w, http.StatusRequestTimeout, "the body arrived too slowly")
	case errors.As(err, &textErr), errors.As(err, &memberErr):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.As(err, &maxErr):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", maxBodyBytes))
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, "the body is empty: send a JSON object")
	case errors.As(err, &typeErr):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the body must be a JSON object, not a JSON %s", typeErr.Value))
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "the body is not valid JSON: "+err.Error())
	default:
		writeError(w, http.StatusBadRequest, "bad body: "+strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil, false
}

// jsonMemberError is an object member given twice.
type jsonMemberError struct{ name string }

func (e *jsonMemberError) Error() string { return fmt.Sprintf("%s is given twice", e.name) }

// objectMembers splits a JSON document that is one object into its members.
func objectMembers(body []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var members map[string]json.RawMessage
	if err := dec.Decode(&members); err != nil {
		return nil, err
	}
	if dec.More() || dec.Decode(new(json.RawMessage)) != io.EOF {
		return nil, errors.New("the body holds more than one JSON value")
	}
	if members == nil { // the body was null
		return nil, &json.UnmarshalTypeError{Value: "null"}
	}
	// The map kept the last of repeated names; walk the tokens for them.
	dec = json.NewDecoder(bytes.NewReader(body))
	_, _ = dec.Token() // {
	seen := make(map[string]bool, len(members))
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := t.(string)
		if seen[name] {
			return nil, &jsonMemberError{name}
		}
		seen[name] = true
		if err := dec.Decode(new(json.RawMessage)); err != nil {
			return nil, err
		}
	}
	return members, nil
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed here; allowed: %s", r.Method, allow))
	}
}

type errorResponse struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorResponse{Error: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// writeRequestFailed answers and logs (as what) a request that failed on
// err: a read past READ_STATEMENT_TIMEOUT is a busy database, not a broken
// one (503, Retry-After); anything else is a 500.
func writeRequestFailed(w http.ResponseWriter, r *http.Request, logger *slog.Logger, what string, err error) {
	if isStatementTimeout(err) {
		logger.Warn(what+" read ran past READ_STATEMENT_TIMEOUT", "method", r.Method, "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
		writeError(w, http.StatusServiceUnavailable, "the database took longer than READ_STATEMENT_TIMEOUT to answer; try again in a few seconds")
		return
	}
	logger.Error(what+" request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "internal error; see the server log")
}

// decodeParsed reads a body that is one JSON object and parses its members
// with parse; a body or parse error is answered (the parse's with 400).
func decodeParsed[T any](w http.ResponseWriter, r *http.Request, parse func(map[string]json.RawMessage) (T, error)) (T, bool) {
	members, ok := decodeBody(w, r)
	if !ok {
		var zero T
		return zero, false
	}
	v, err := parse(members)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return v, false
	}
	return v, true
}

// answeredError answers err unless it is nil: 404 with missing when it is
// notFound, else as failed does (500, or 503 for a read past its timeout).
// It says whether it answered.
func answeredError(w http.ResponseWriter, r *http.Request, err, notFound error, missing string,
	failed func(http.ResponseWriter, *http.Request, error)) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, notFound):
		writeError(w, http.StatusNotFound, missing)
	default:
		failed(w, r, err)
	}
	return true
}
