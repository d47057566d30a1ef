package main

import "testing"

func BenchmarkPlayParseDetails(b *testing.B) {
	page := readPlaystoreFixture(b, "details_com.mojang.minecraftpe_en_us.html")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseDetailsPage(page); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlayParseReviewsPage(b *testing.B) {
	body := readPlaystoreFixture(b, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		payload, err := parseBatchexecute(body, "UsvDTd")
		if err != nil {
			b.Fatal(err)
		}
		if p := parseReviewsPayload(payload); len(p.Reviews) != 150 {
			b.Fatal(len(p.Reviews))
		}
	}
}
