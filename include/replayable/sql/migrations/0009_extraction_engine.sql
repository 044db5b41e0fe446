-- The engine that read each extraction's text (ADR 0103): pdfium or pypdf. Under the
-- ``auto`` policy it tells which documents PDFium refused or found empty. The policy itself
-- is part of extractor_version ('2.0+auto'), which keys the row.
--
-- Rows written before engines were chosen were all read by pypdf.

ALTER TABLE replayable.extractions ADD COLUMN IF NOT EXISTS engine text NOT NULL DEFAULT 'pypdf';
ALTER TABLE replayable.extractions ALTER COLUMN engine DROP DEFAULT;
