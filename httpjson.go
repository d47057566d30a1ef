package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// maxBodyBytes bounds a request body; a larger one is answered with 413.
const maxBodyBytes = 64 << 10

// decodeBody reads one JSON value of at most maxBodyBytes into dst, refusing
// unknown fields; on failure it has written the 4xx answer.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		// curl -d sends form encoding by default; the body is read as JSON anyway.
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json") && mt != "application/x-www-form-urlencoded") {
			writeError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q is not JSON: send application/json", ct))
			return false
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err == nil {
		// encoding/json would store both as U+FFFD without a word.
		err = checkJSONText(body)
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		err = dec.Decode(dst)
		if err == nil && dec.Decode(new(json.RawMessage)) != io.EOF {
			err = errors.New("the body holds more than one JSON value")
		}
	}
	var maxErr *http.MaxBytesError
	var textErr *jsonTextError
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case err == nil:
		return true
	case errors.As(err, &textErr):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.As(err, &maxErr):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", maxBodyBytes))
	case errors.Is(err, io.EOF):
		writeError(w, http.StatusBadRequest, "the body is empty: send a JSON object")
	case errors.As(err, &typeErr) && typeErr.Field != "":
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s has the wrong type: got a JSON %s", typeErr.Field, typeErr.Value))
	case errors.As(err, &typeErr):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the body must be a JSON object, not a JSON %s", typeErr.Value))
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "the body is not valid JSON: "+err.Error())
	default:
		writeError(w, http.StatusBadRequest, "bad body: "+strings.TrimPrefix(err.Error(), "json: "))
	}
	return false
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
