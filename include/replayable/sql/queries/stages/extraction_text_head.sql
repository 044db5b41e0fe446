-- The start of one document's extracted text: what a summary reads (summary_input_chars).
SELECT left(text, %(chars)s) AS text FROM replayable.extractions
WHERE doc_id = %(doc_id)s AND extractor_version = %(extractor_version)s
