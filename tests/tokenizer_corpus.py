"""A varied, deterministic corpus for tokenizer equivalence (well over 300 texts).

Each family targets a place where a byte-level BPE with a custom pre-tokenizer goes wrong:
piece boundaries around whitespace runs and punctuation, digits, scripts without spaces,
multi-codepoint graphemes, and long inputs.
"""

from __future__ import annotations

import random

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune...",
    "Don't stop—we're almost there! (Really?) Yes: \"really\".",
    "L'été dernier, nous sommes allés à Montréal; c'était très agréable.",
    "Größere Straßen führen über die Brücke nach Köln.",
    "¿Dónde está la biblioteca? ¡Está allí, señor!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले",
    "আমি বাংলায় গান গাই।",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧！",
    "我們在臺北車站見面，好嗎？",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。カタカナもテストします。",
    "東京スカイツリーは634メートルです。",
    "다람쥐 헌 쳇바퀴에 타고파. 한국어 문장입니다.",
    "Tiếng Việt có dấu: Trăm năm trong cõi người ta, chữ tài chữ mệnh khéo là ghét nhau.",
    "Pijamalı hasta yağız şoföre çabucak güvendi.",
    "Zażółć gęślą jaźń.",
    "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "ქართული ენა ძალიან ლამაზია.",
    "Հայերենը հնդեվրոպական լեզու է։",
    "የኢትዮጵያ ፊደል ግዕዝ ነው።",
    "தமிழ் ஒரு பழமையான மொழி.",
    "Ölçü: 3,5 km² — sıcaklık −12 °C; fiyat €9.99 (≈ $10.80).",
    "lol 😂😂 that's so 🔥🔥🔥 ngl... #blessed @friend",
    "Mixed 中文 and English and 日本語 in one line, plus русский.",
    "e.g. i.e. etc. vs. Mr. Dr. U.S.A. a.m. p.m.",
]

CODE = [
    "def f(x):\n    if x:\n        return [y for y in x if y]\n    return None\n",
    "class A:\n\tdef __init__(self):\n\t\tself.x = 1\n\t\tif self.x:\n\t\t\tpass\n",
    "        " * 4 + "deeply_nested_call(arg1, arg2)\n" + "                " * 2 + "}\n",
    "func main() {\n\tfmt.Println(\"hello\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i\n\t}\n}\n",
    "const f = async (a, b) => { await g(a?.b ?? c); return a === b || !!c; };\n",
    "int *p = &x; p->next = NULL; if (a<<2 >= b>>1 && c != d) { return -1; }\n",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}\n",
    "key:\n  - name: value\n    other: 'quoted'\n  - list: [1, 2, 3]\n",
    '{"a": 1, "b": [true, false, null], "c": {"d": "e\\n"}}',
    "all: build\n\nbuild:\n\tgcc -O2 -o app main.c\n\t@echo done\n",
    "cat file.txt | grep -E '^[a-z]+$' | sort -u > out.txt 2>&1 && echo ok || exit 1\n",
    "<div class=\"x\"><p>Hello</p></div>\n<br/><!-- comment -->\n</html>",
    "SELECT a.id, COUNT(*) FROM t AS a WHERE a.x >= 10 GROUP BY a.id HAVING COUNT(*) > 1;",
    r"\begin{equation} \int_0^\infty e^{-x^2} dx = \frac{\sqrt{\pi}}{2} \end{equation}",
    "x = re.compile(r'(?P<name>[A-Za-z_]\\w*)\\s*=\\s*(\\d+\\.?\\d*)')\n",
    "    \n    \n        return x\n\n\n\ndef g():\n    pass\n",
    "if (x) {\r\n    y();\r\n}\r\n",
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"%d\\n\", 42);\n}\n",
    "public static void main(String[] args) {\n        System.out.println(\"hi\");\n    }\n",
    "```python\nprint('fenced')\n```\n",
    "a=1;b=2;c=a+b;d=c*2;e=d/3;f=e%4;g=f**5;h=g//6;",
    "__init__ __main__ _private .method ._x ..x ...y ::scope ->arrow =>fat",
    "// TODO(user): fix this\n/* block\n * comment\n */\n",
    "    >>> import numpy as np\n    >>> np.zeros((3, 4)).shape\n    (3, 4)\n",
]

WHITESPACE = (
    [" " * n + "word" for n in range(1, 21)]
    + ["word" + " " * n for n in range(1, 9)]
    + [" " * n + "." for n in range(1, 9)]
    + ["a" + " " * n + "b" for n in range(1, 12)]
    + ["\n" * n + "x" for n in range(1, 6)]
    + ["x" + "\n" * n for n in range(1, 6)]
    + ["\t" * n + "x" for n in range(1, 6)]
    + [
        "\r\n", "\r\n\r\n", "a\r\nb\r\n", "a\rb", " \n \n\t\n", "  \n  ", "\n   \n", "\t \t x",
        "line1  \nline2\t\n", "\u00a0nbsp\u00a0here", "ideo\u3000space", "en\u2002space",
        "\f form feed", "\v vertical", "x \n\n y", " ;\n", " ...\n\n", ">;\n", "a  ,  b",
        "    ", "\n", " ", "\t", "  !!", " (  )  ", "\u2028sep\u2029para", "end. \n",
    ]
)

DIGITS = (
    ["".join(str((i * 7 + k) % 10) for k in range(n)) for i, n in enumerate(range(1, 41))]
    + [
        "1,234,567.89", "-42", "+3.14e-10", "0x7FFF_FFFF", "0b1010", "1_000_000", "2026-11-29T11:15:03Z",
        "+1 (555) 123-4567", "v1.2.3-rc.4", "3/4 + 1/2 = 5/4", "١٢٣٤٥٦٧", "१२३४५६", "１２３４５",
        "x²+y³=z⁴", "½ ¼ ¾", "①②③", "Ⅻ", "99.9%", "$1,000,000", "10km", "abc123def4567",
        "00000000000000", "3.14159265358979323846264338327950288419716939937510",
    ]
)

GRAPHEMES = [
    "👨\u200d👩\u200d👧\u200d👦 family", "🏳️\u200d🌈 flag", "👍🏽 👍🏿", "🇫🇷🇯🇵🇺🇸", "1️⃣ 2️⃣ #️⃣",
    "❤️ ❤ ♥️", "🧑\u200d💻 coding", "e\u0301 vs é", "a\u0300\u0301\u0302\u0303 stacked",
    "Z\u0351\u0354\u0308a\u0316\u0317l\u0310g\u0352o\u0327", "\u1100\u1161\u11a8 jamo", "क्षत्रिय्",
    "ﷺ ﷽", "\u200b zero\u200bwidth \u200c\u200d", "\ufeffBOM", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "🀄🃏🎴",
    "\U0001f9d1\U0001f3fb\u200d\U0001f91d\u200d\U0001f9d1\U0001f3ff", "ğ̸̡̛̤͔̝̩̖͍̤̮͐̈́ͅ",
    "\u0627\u0644\u0652\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u0651\u064e\u0629",
]

LONG = [
    "lorem ipsum dolor sit amet " * 120,
    "A" * 3000,
    "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo" * 60,
    "function(a){return a.map(function(b){return b*2}).filter(Boolean)}" * 40,
    "https://example.com/very/long/path?with=query&and=more&x=" + "abc%20" * 200,
    "漢字" * 800,
    "- item\n" * 300,
    "\t" * 50 + "x" + " " * 300 + "y",
]

FRAGMENTS = PROSE[:12] + [c.splitlines()[0] for c in CODE] + DIGITS[40:] + GRAPHEMES[:10] + [
    "  ", "\n", "\t", "\r\n", "...", "?!", "—", "(x)", "[]", "{}", "''", '""', " -> ", "::", "  ->  ",
]


def mixed(n: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(2, 8)
        out.append("".join(rng.choice(FRAGMENTS) for _ in range(k)))
    return out


def corpus() -> list[str]:
    return PROSE + CODE + WHITESPACE + DIGITS + GRAPHEMES + LONG + mixed(160)
