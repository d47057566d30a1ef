package main

import "time"

// notifyPayload is what notifications.payload holds: everything a message
// says, decided with the event and rendered per channel when it is sent.
// A webhook's body is this object with delivery_id added.
type notifyPayload struct {
	Event  string         `json:"event"` // review, rating_drop, negative_spike, crawl_failing, new_version, digest, test
	App    payloadApp     `json:"app"`
	Review *payloadReview `json:"review,omitempty"` // event review
	Alert  *payloadAlert  `json:"alert,omitempty"`  // the other events
	Digest *payloadDigest `json:"digest,omitempty"` // event digest
	Links  payloadLinks   `json:"links"`
}

type payloadApp struct {
	PackageName string `json:"package_name"`
	DisplayName string `json:"display_name"`
	Country     string `json:"country"`
	Lang        string `json:"lang"`
}

type payloadReview struct {
	ReviewID   string    `json:"review_id"`
	UserName   string    `json:"user_name"`
	Stars      int       `json:"stars"`
	Text       string    `json:"text"`
	At         time.Time `json:"at"`
	AppVersion string    `json:"app_version"`
	Sentiment  string    `json:"sentiment"`
	// SentimentFromStars: the label came from the stars alone (the job had
	// not scored the review within NOTIFY_SENTIMENT_WAIT); the message says so.
	SentimentFromStars bool       `json:"sentiment_from_stars,omitempty"`
	TextLang           string     `json:"text_lang"`
	ReplyText          string     `json:"reply_text"`
	RepliedAt          *time.Time `json:"replied_at"`
	URL                string     `json:"url"`
}

// payloadAlert: kind is the event (rating_drop, negative_spike,
// crawl_failing, new_version); ended_at is set on the message that says an
// alert ended (crawl_failing).
type payloadAlert struct {
	Kind      string     `json:"kind"`
	Summary   string     `json:"summary"`
	Value     string     `json:"value"`
	Previous  string     `json:"previous"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
}

// payloadDigest stands for the messages a rule's max_per_hour held back
// from one destination, of every app of the rule: apps counts them per app
// (the payload's app is set when there is one).
type payloadDigest struct {
	Count int                `json:"count"`
	Of    string             `json:"of"` // the event of the messages it stands for
	Apps  []payloadDigestApp `json:"apps"`
}

type payloadDigestApp struct {
	PackageName string `json:"package_name"`
	DisplayName string `json:"display_name"`
	Count       int    `json:"count"`
}

type payloadLinks struct {
	Play       string `json:"play"`
	StatusPage string `json:"status_page,omitempty"`
}
