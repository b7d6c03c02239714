"""Structured invoices for KSeF (Krajowy System e-Faktur): every VAT invoice the console issues as an FA(3)
document (``fa3``), kept in PostgreSQL with its state towards KSeF (``store``), sent through the KSeF API v2
when the operator configures it (``settings``, ``sender``) by the console's background loop (``worker``),
with the verification QR code on the PDF (``qr``).  README, "Invoices", says what is the law and what the
operator chooses."""
