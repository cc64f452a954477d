"""Dates: a note's own date, read from what it says about itself, and the dates a search
filter is given in. Ingest reads the first (frontmatter, a document's headers, a daily note's
file name, a PDF's metadata); the search ops read the second (`--since 7d`). A copied or synced
vault gives every file a new modification time, so the file's time is the last resort.

A note's date is the most recent one it states: `updated` (or `modified`, `lastmod`, ...),
else `date`, else `created`; a filter's "since" is then "changed since", as it is of a file's
modification time.
"""

from __future__ import annotations

import datetime
import re

# frontmatter keys (lower case, '_' and ' ' as '-'), in the order they win
UPDATED_KEYS = ("updated", "modified", "last-modified", "lastmod", "date-modified",
                "date-updated", "updated-at", "modified-at")
DATE_KEYS = ("date",)
CREATED_KEYS = ("created", "date-created", "created-at", "creation-date")
NOTE_KEYS = UPDATED_KEYS + DATE_KEYS + CREATED_KEYS

MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug",
                                      "sep", "oct", "nov", "dec"), 1)}
ISO = re.compile(r"(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})"
                 r"(?:[T ](\d{1,2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?\s*(Z|[+-]\d{2}(?::?\d{2})?)?)?")
DAY_MONTH_YEAR = re.compile(r"(\d{1,2})[- ]([A-Za-z]{3})[A-Za-z]*[- ,]+(\d{4})")  # 28-Feb-2018
# a daily note: '2024-03-05.md', '2024-03-05 Standup.md', '2024_03_05.md'
FILE_NAME = re.compile(r"(\d{4})[-_.](\d{2})[-_.](\d{2})(?!\d)")


def parse(value) -> datetime.datetime | None:
    """A date as notes write it (2024-03-05, 2024-03-05T10:30, 2024/03/05 10:30+02:00,
    28-Feb-2018), or None. A date without a time is its day's local midnight; one without a
    zone is local time."""
    if isinstance(value, list):  # (a frontmatter list: its first)
        value = value[0] if value else None
    if not isinstance(value, str):
        return None
    text = value.strip().strip("\"'")
    m = ISO.fullmatch(text)
    try:
        if m:
            y, mo, d, h, mi, s, zone = m.groups()
            tz = None
            if zone == "Z":
                tz = datetime.timezone.utc
            elif zone:
                sign = -1 if zone[0] == "-" else 1
                digits = zone[1:].replace(":", "")
                tz = datetime.timezone(sign * datetime.timedelta(
                    hours=int(digits[:2]), minutes=int(digits[2:] or 0)))
            return datetime.datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0),
                                     int(s or 0), tzinfo=tz)
        m = DAY_MONTH_YEAR.fullmatch(text)
        if m and m.group(2).lower() in MONTHS:
            return datetime.datetime(int(m.group(3)), MONTHS[m.group(2).lower()],
                                     int(m.group(1)))
    except ValueError:  # 2024-02-30, hour 25
        return None
    return None


def stamp(when: datetime.datetime) -> float:
    """Unix seconds (a naive date-time is local time)."""
    return when.timestamp()


def shown(when: datetime.datetime) -> str:
    """As a result shows it: the date, and its time when it has one."""
    if (when.hour, when.minute, when.second) == (0, 0, 0) and when.tzinfo is None:
        return when.date().isoformat()
    return when.isoformat(timespec="minutes" if not when.second else "seconds")


def from_fields(fields: dict, where: str) -> tuple[datetime.datetime, str] | None:
    """The note's date from its frontmatter (or headers) and what it came from, e.g.
    (2024-03-05, "frontmatter created"); None when none of the keys holds a date."""
    keyed = {re.sub(r"[_ ]", "-", str(k).strip().lower()): v for k, v in fields.items()}
    for key in NOTE_KEYS:
        when = parse(keyed.get(key))
        if when is not None:
            name = next(k for k in fields if re.sub(r"[_ ]", "-", str(k).strip().lower()) == key)
            return when, f"{where} {name}"
    return None


def from_file_name(stem: str) -> datetime.datetime | None:
    """A daily note's date: the file name starts with it."""
    m = FILE_NAME.match(stem)
    if m is None:
        return None
    try:
        return datetime.datetime(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return None


def from_pdf(value: str) -> datetime.datetime | None:
    """pdfinfo's date ('Tue Mar  5 10:30:00 2024 CET', or ISO with -isodates)."""
    when = parse(value)
    if when is not None:
        return when
    m = re.match(r"\w{3}\s+(\w{3})\s+(\d{1,2})\s+(\d{1,2}):(\d{2}):(\d{2})\s+(\d{4})",
                 value.strip())
    if m and m.group(1).lower() in MONTHS:
        try:
            return datetime.datetime(int(m.group(6)), MONTHS[m.group(1).lower()],
                                     int(m.group(2)), int(m.group(3)), int(m.group(4)),
                                     int(m.group(5)))
        except ValueError:
            return None
    return None


# -- filters ------------------------------------------------------------------------------------

AGO = re.compile(r"(\d+)\s*(d|days?|w|weeks?|m|months?|y|years?)(?:\s+ago)?", re.I)


def relative(text: str, now: datetime.datetime | None = None) -> float | None:
    """A filter's relative date as Unix seconds: 'today' and 'yesterday' (their local
    midnight), '7d', '2w', '3m' (months), '1y' (and '7 days ago'): the start of the day that
    many days, weeks, months or years back, so that "--since 1d" keeps yesterday's daily note
    (dated by its day). None when the text is none of these."""
    now = now or datetime.datetime.now()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    word = text.strip().lower()
    if word in ("today", "now"):
        return stamp(midnight) if word == "today" else stamp(now)
    if word == "yesterday":
        return stamp(midnight - datetime.timedelta(days=1))
    m = AGO.fullmatch(word)
    if m is None:
        return None
    n, unit = int(m.group(1)), m.group(2)[0]
    if unit in "dw":
        return stamp(midnight - datetime.timedelta(days=n * (7 if unit == "w" else 1)))
    months = n * (12 if unit == "y" else 1)
    y, mo = divmod(midnight.year * 12 + midnight.month - 1 - months, 12)
    if y < 1:
        return None
    day = midnight.day
    while True:  # (31 March less a month: the last day of February)
        try:
            return stamp(midnight.replace(year=y, month=mo + 1, day=day))
        except ValueError:
            day -= 1
