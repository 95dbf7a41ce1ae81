"""The word tables of the semantic-cache guards (`titan.cache.guards`), apart from the logic so
that each stays readable, and the stemmer the antonym table is built with. Constants only:
read-only sets and mappings, built from strings at import."""

from __future__ import annotations

from types import MappingProxyType


def words(text: str) -> frozenset[str]:
    """A word table written as one string: tables of hundreds of words stay readable."""
    return frozenset(text.split())


def mapping(text: str) -> MappingProxyType[str, str]:
    """ "canonical alias alias, canonical alias" -> {alias: canonical, canonical: canonical}."""
    table = {}
    for group in text.split(","):
        canonical, *aliases = group.split()
        for alias in (canonical, *aliases):
            table[alias] = canonical
    return MappingProxyType(table)


# Contractions also without the apostrophe people often skip ("dont"); "n't" is counted apart.
NEGATIONS = words(
    "not no never none nothing nobody nowhere neither nor without cannot cant dont doesnt didnt "
    "isnt arent wasnt werent wont wouldnt shouldnt couldnt hasnt havent hadnt mustnt neednt aint"
)
# Verbs that negate what follows: "avoid/prevent sticking" == "not stick". "stop" and "quit" only
# before an -ing form ("stop draining", not "stop the server"); "stop" and "keep" before "from"
# ("keep avocados from browning").
NEGATING_VERBS = words("avoid avoids avoided avoiding prevent prevents prevented preventing")
NEGATING_BEFORE_ING = words("stop stops stopped stopping quit quits quitting")
NEGATING_BEFORE_FROM = words("stop stops stopped stopping keep keeps kept keeping")
NEGATING = NEGATING_VERBS | NEGATING_BEFORE_ING | NEGATING_BEFORE_FROM

CARDINALS = MappingProxyType(
    {
        "zero": 0, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
        "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
        "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
        "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
        "eighty": 80, "ninety": 90, "dozen": 12,
    }
)  # fmt: skip
# "one" is missing on purpose: it mostly stands for "a" ("combine into one", "one cup" == "a cup",
# "which one"), so "one" and "a" compare equal; "1" written as a digit still counts.
SCALES = MappingProxyType(
    {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
)
OTHER_NUMBER_WORDS = MappingProxyType(
    {
        "first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th",
        "sixth": "6th", "seventh": "7th", "eighth": "8th", "ninth": "9th", "tenth": "10th",
        "half": "0.5", "twice": "2", "double": "2", "thrice": "3", "triple": "3",
    }
)  # fmt: skip
# "a second", "per second": the unit, not the ordinal.
SECOND_AS_UNIT_AFTER = words("a per each every one")

# Units that change the answer; canonical name first, then the ways people write it. Compared
# anywhere in the text ("ounces in a pound" != "grams in a pound"), and attached to the number
# they follow ("5 km" != "5 miles").
MEASURE_UNITS = mapping(
    "mm millimeter millimeters millimetre millimetres, cm centimeter centimeters centimetre "
    "centimetres, meter meters metre metres, km kilometer kilometers kilometre kilometres kms, "
    "inch inches, ft foot feet, yard yards yd yds, mile miles mi, mg milligram milligrams, "
    "gram grams, kg kilogram kilograms kilo kilos kgs, lb lbs pound pounds, oz ounce ounces, "
    "ton tons tonne tonnes, ml milliliter milliliters millilitre millilitres, liter liters "
    "litre litres, cup cups, tbsp tablespoon tablespoons, tsp teaspoon teaspoons, pint pints, "
    "quart quarts qt, gallon gallons gal, celsius centigrade, fahrenheit, kelvin, kb kilobyte "
    "kilobytes, mb megabyte megabytes, gb gigabyte gigabytes, tb terabyte terabytes, mph, kph kmh, "
    "calorie calories kcal, acre acres, hectare hectares, sqft"
)
# Time units matter next to a number ("5 years" != "5 months") but are too common elsewhere
# ("time of year") to compare on their own.
TIME_UNITS = mapping(
    "second seconds sec secs, minute minutes min mins, hour hours hr hrs, day days, week weeks, "
    "month months, year years yr yrs, decade decades, century centuries"
)
NUMBER_SUFFIXES = mapping("% percent, am a.m, pm p.m, st, nd, rd, th")
# "pound" is left to the weight: "50 pounds" is ambiguous, "£50" is not.
CURRENCIES = mapping("usd dollar dollars bucks, eur euro euros, gbp quid, jpy yen")

# Lowercase-typed names that decide the answer ("polars vs pandas"). Words with another common
# meaning ("go", "swift", "spark", "word", "edge") are left out.
TECH_NAMES = words(
    "python java javascript typescript rust golang kotlin ruby php perl scala haskell elixir "
    "erlang julia matlab fortran cobol pandas polars numpy scipy pytorch torch tensorflow keras "
    "sklearn jax react vue angular svelte nextjs django flask fastapi laravel nodejs deno docker "
    "podman kubernetes k8s terraform ansible aws azure gcp heroku vercel netlify iphone ipad "
    "android ios windows macos linux ubuntu debian fedora centos excel powerpoint outlook chrome "
    "firefox safari postgres postgresql mysql sqlite mongodb redis kafka pyspark hadoop git "
    "github gitlab bitbucket vim emacs vscode bash zsh powershell nginx chatgpt openai gemini "
    "claude llama gmail whatsapp youtube paypal"
)
# Short names for the same thing, canonical form first; "_" joins the words of a longer name
# (an entity "United States" is found in a text saying "USA", and the other way round).
_ALIASES = (
    "kubernetes k8s kube, javascript js, typescript ts, go golang, python py, postgresql postgres "
    "psql, television tv, united_states usa, united_kingdom uk, european_union eu, "
    "new_york nyc, los_angeles la"
)
ALIASES = MappingProxyType(
    {alias: canonical.replace("_", "") for alias, canonical in mapping(_ALIASES).items()}
)
ALIAS_PARTS = MappingProxyType(
    {name.replace("_", ""): tuple(name.split("_")) for name in set(mapping(_ALIASES).values())}
)
# Aliases that are common words in lowercase ("us"): applied to the all-caps spelling only.
CAPS_ALIASES = MappingProxyType({"US": "unitedstates", "U.S": "unitedstates"})
# "Africa" is in "African", "Sunday" in "Sundays", "Japan" in "Japanese": demonyms and plurals.
ENTITY_SUFFIXES = words("s es n ns an ans ian ians ese")

# A capitalized first word of a sentence is an entity unless it is one of these openers.
OPENERS = words(
    "what whats what's how hows how's why when where who whom whose which is are was were am be "
    "can could should would will shall may might must do does did done have has had i i'm i've "
    "i'd i'll my me we our us you your they their them he she it its it's this that these those "
    "there here the a an any some all each every no not yes ok okay please hi hello hey thanks "
    "thank so and but or if then also now just still yet again maybe perhaps actually basically "
    "in on at by for from to of with without about after before during since until as like "
    "between among under over into onto than tell explain describe define give show list name "
    "write rewrite summarize summarise translate convert calculate compute compare find make "
    "create build generate suggest recommend help fix solve implement provide use let get set "
    "check add remove delete change update install uninstall run start stop open close turn "
    "keep put take send read print plot sort draft design plan count estimate predict isn't "
    "aren't can't cannot don't doesn't didn't won't wouldn't shouldn't couldn't best good bad "
    "most more less many much few one two three first second last next new old other another "
    "same different quick quickly simple simply briefly really very why's where's who's when's "
    "quick question"
)
I_FORMS = words("i i'm i'd i'll i've")
DETERMINERS = words("a an the my your our their his her its this that these those some any")
# Not verbs: "is in", "what's on" carry no particle.
FUNCTION_WORDS = DETERMINERS | words(
    "what what's which who how why when where is are was were be been being am it i you we they "
    "he she me him them us of and or to in on at by for with from into onto as than if so not no "
    "do does did can could should would will up down out off"
)

# Pairs of opposites; each word refuses a hit on its antonym. Comparatives and superlatives
# ("warmer", "coldest") reach the table through stemming. "in/out", "on/off", "up/down" are only
# opposites right after a verb (PARTICLES): alone they are parts of too many phrases.
ANTONYM_PAIRS = """
increase decrease, increase reduce, increase lower, increment decrement, raise lower, rise fall,
grow shrink, expand collapse, gain loss, gain lose, profit loss, win lose, buy sell, borrow lend,
send receive, import export, upload download, push pull, upgrade downgrade, upstream downstream,
upper lower, uppercase lowercase, upward downward, upside downside, input output,
inbound outbound, internal external, enable disable, allow block, allow deny, allow forbid,
accept reject, approve reject, approve deny, include exclude, include omit, inclusive exclusive,
add remove, add subtract, add delete, insert delete, create delete, install remove, mount eject,
connect disconnect, attach detach, join leave, enter exit, arrive depart, arrival departure,
deposit withdraw, deposit withdrawal, encrypt decrypt, encode decode, show hide, visible hidden,
open close, start stop, start end, begin end, start finish, first last, before after,
early late, past future, yesterday tomorrow, morning evening, day night, summer winter,
sunrise sunset, min max, minimum maximum, minimize maximize, minimal maximal,
ascending descending, asc desc, best worst, better worse, good bad, fast slow, quick slow,
big small, large small, long short, high low, heavy light, dark light, hot cold, warm cold,
warm cool, cheap expensive, cheap pricey, cheap pricy, rich poor, safe dangerous, safe unsafe,
true false, positive negative, correct wrong, right wrong, north south, east west, above below,
left right, top bottom, inside outside, inhale exhale, success failure, succeed fail, pass fail,
online offline, public private, sync async, synchronous asynchronous, static dynamic,
more less, more fewer, most least, many few, all none, everything nothing, always never,
plus minus, multiply divide, frontend backend, client server, read write, odd even, wide narrow,
thick thin, deep shallow, new old, old young, male female, men women, boy girl, husband wife,
wet dry, easy hard, easy difficult, simple complex, strong weak, strength weakness, full empty,
alive dead, asleep awake, remember forget, ancient modern, bullish bearish, pro con,
advantage drawback, benefit drawback, benefit risk, overestimate underestimate,
overflow underflow, overweight underweight, horizontal vertical, row column, width height,
hire fire, love hate, agree disagree, like dislike, increase cut, lend borrow, credit debit,
income expense, asset liability, buyer seller, employer employee, landlord tenant,
parent child, teacher student, winner loser, attack defend, offense defense, sweet sour,
happy sad, cause cure, encourage discourage
"""
# Opposites made with a prefix: "block/unblock", "toxic/non-toxic", "advantage/disadvantage".
OPPOSITE_PREFIXES = ("un", "non", "dis", "in", "im", "il", "ir", "de", "anti")
# For three-letter stems ("mute/unmute") only the prefixes that rarely start unrelated words.
SHORT_OPPOSITE_PREFIXES = ("un", "non", "dis", "anti")
# Verb particles: "zoom in/out", "turn on/off", "scale up/down", "log in/out".
PARTICLES = MappingProxyType(
    {"in": "out", "out": "in", "on": "off", "off": "on", "up": "down", "down": "up"}
)
# Words that make one thing the source and another the target: "from A to B", "A into B".
DIRECTION_WORDS = words("to into from")

# What a question asks for. Two questions that both ask for a specific kind of answer, but
# different kinds, are different ("When was it built?" vs "How tall is it?"); a generic "what"
# or "how do I" proves nothing.
QUESTION_WORDS = MappingProxyType(
    {"when": "time", "where": "place", "who": "person", "whom": "person", "whose": "person",
     "why": "reason"}
)  # fmt: skip
# "How many", "how long", "how tall"...: all ask for a quantity. Finer kinds ("how many days" vs
# "how long") split too many paraphrases.
HOW_WORDS = words("much many long often old tall big large high far")
WHAT_TIME_WORDS = words("year time date day month century")


def stem(word: str) -> str:
    """Crude suffix stripping, applied to the table and to both texts alike (so only consistency
    matters): increases/increased/increasing -> "increas", coldest -> "cold", bigger -> "big".
    Slices rather than endswith chains: it runs for most words of every lookup."""
    if len(word) > 4 and word[-3:] in ("ies", "ier"):
        word = word[:-3] + "y"
    elif len(word) > 5 and word[-4:] == "iest":
        word = word[:-4] + "y"
    elif len(word) > 3 and word[-1] == "s" and word[-2:] not in ("ss", "us", "is"):
        word = word[:-1]
    if len(word) > 5 and word[-3:] in ("ing", "est"):
        word = word[:-3]
    elif len(word) > 4 and word[-2:] in ("ed", "er"):
        word = word[:-2]
    if len(word) > 3 and word[-1] == "e":
        word = word[:-1]
    if len(word) > 2 and word[-1] == word[-2] and word[-1] not in "aeiou":
        word = word[:-1]
    return word


def _antonym_table(pairs: str) -> MappingProxyType[str, frozenset[str]]:
    table: dict[str, set[str]] = {}
    for pair in pairs.split(","):
        left, right = (stem(word) for word in pair.split())
        table.setdefault(left, set()).add(right)
        table.setdefault(right, set()).add(left)
    return MappingProxyType({word: frozenset(opposites) for word, opposites in table.items()})


ANTONYMS = _antonym_table(ANTONYM_PAIRS)
