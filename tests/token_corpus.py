"""Texts on which the token estimator (core/cost.py) is calibrated and measured: Polish and English,
as clients send them: greetings, questions, instructions, long paragraphs, lists, numbers and a little
code.  Written for this suite."""
from __future__ import annotations

POLISH: tuple[str, ...] = (
    "Dzień dobry",
    "Ala ma kota",
    "Cześć! Jak się masz?",
    "Jaka jest stolica Polski?",
    "Przetłumacz na angielski: „Zamówienie zostanie wysłane jutro rano”.",
    "Napisz krótki wiersz o jesieni w Krakowie, najlepiej czterowiersz z rymem.",
    "Podaj trzy zalety i trzy wady pracy zdalnej w małej firmie programistycznej.",
    "Zażółć gęślą jaźń. Chrząszcz brzmi w trzcinie w Szczebrzeszynie.",
    "Streść poniższy tekst w dwóch zdaniach: Spółka zanotowała w trzecim kwartale wzrost przychodów o 12 %, "
    "głównie dzięki sprzedaży usług chmurowych klientom z sektora publicznego. Zarząd zapowiedział "
    "dalsze inwestycje w centra danych w Warszawie i Poznaniu oraz zatrudnienie 150 nowych inżynierów.",
    "Jesteś pomocnym asystentem obsługi klienta sklepu internetowego. Odpowiadaj uprzejmie, zwięźle i "
    "wyłącznie po polsku. Jeżeli nie znasz odpowiedzi, poproś o numer zamówienia i przekaż sprawę do "
    "konsultanta. Nie podawaj cen, których nie ma w katalogu.",
    "Mam problem z fakturą nr FV/2024/03/117 wystawioną 14.03.2024 na kwotę 1 234,56 zł brutto. "
    "Stawka VAT powinna wynosić 8 %, a nie 23 %. Proszę o korektę i przesłanie jej na adres e-mail.",
    "Wyjaśnij różnicę między listą a krotką w Pythonie i pokaż przykład: `punkty = [(1, 2), (3, 4)]`.",
    "W dniu dzisiejszym, po długiej i burzliwej dyskusji, rada gminy przyjęła uchwałę w sprawie "
    "budowy nowej szkoły podstawowej. Inwestycja ma kosztować około czterdziestu milionów złotych i "
    "zostać ukończona przed rozpoczęciem roku szkolnego dwa tysiące dwudziestego siódmego. Mieszkańcy "
    "od lat skarżyli się na przepełnione klasy i nauczanie na dwie zmiany, dlatego decyzję przyjęto z "
    "dużą ulgą. Część radnych wskazywała jednak, że gmina powinna najpierw wyremontować istniejące "
    "budynki, a dopiero potem myśleć o nowych.",
    "1. Kup mleko\n2. Odbierz paczkę z paczkomatu\n3. Zadzwoń do mamy\n4. Opłać rachunek za prąd",
)

ENGLISH: tuple[str, ...] = (
    "Hello",
    "Good morning!",
    "What is the capital of Poland?",
    "Translate into Polish: \"The order will be shipped tomorrow morning.\"",
    "Write a short poem about autumn in Krakow, preferably a rhyming quatrain.",
    "List three advantages and three disadvantages of remote work in a small software company.",
    "The quick brown fox jumps over the lazy dog.",
    "Summarise the following text in two sentences: The company reported a 12% rise in revenue in the "
    "third quarter, mainly thanks to sales of cloud services to public-sector customers. The board "
    "announced further investment in data centres in Warsaw and Poznan and the hiring of 150 engineers.",
    "You are a helpful customer-service assistant for an online shop. Answer politely, briefly and only "
    "in English. If you do not know the answer, ask for the order number and hand the case over to a "
    "human agent. Never quote prices that are not in the catalogue.",
    "I have a problem with invoice no. INV/2024/03/117 issued on 14.03.2024 for 1,234.56 PLN gross. "
    "The VAT rate should be 8%, not 23%. Please correct it and send the correction to my e-mail address.",
    "Explain the difference between a list and a tuple in Python and show an example: "
    "`points = [(1, 2), (3, 4)]`.",
    "Today, after a long and heated debate, the municipal council adopted a resolution on the "
    "construction of a new primary school. The investment is expected to cost about forty million zloty "
    "and to be completed before the start of the school year two thousand twenty-seven. Residents had "
    "complained for years about overcrowded classrooms and teaching in two shifts, so the decision was "
    "met with great relief. Some councillors argued, however, that the municipality should first "
    "renovate the existing buildings and only then think about new ones.",
    "1. Buy milk\n2. Pick up the parcel from the locker\n3. Call mum\n4. Pay the electricity bill",
)
